"""The webhook transport alone: aiohttp (webhooks/delivery/transport.py) against the hand-framed
transport it replaced, in the same process run (figures, never assertions).

    .venv/bin/python bench/transport_bench.py [--requests 20000] [--window 64] [--rounds 3]
        [--baseline-commit 221e649] [--smoke]

What runs, all on this machine:

- the sink of the delivery bench (bench/sink.py: one uvloop + httptools process answering 200
  on keep-alive connections, far faster than either transport);
- in this process, each transport in turn (alternating, --rounds times each, so drift in the
  machine's load hits both alike): --requests POSTs of a delivery-sized body (600 bytes) with
  a delivery's headers (Content-Type, the X-A2A-* headers, the Standard Webhooks trio, a
  token, an Authorization), kept --window in flight through `submit` as the delivery pump
  does (each finished send is replaced by the next at once);
- the baseline is the transport as it stood at --baseline-commit (the last commit that framed
  HTTP itself over httptools; then webhooks/transport.py), read from git into var/bench/ and
  imported beside today's, its imports of modules that have moved since (webhooks.ssrf, now
  webhooks.delivery.ssrf) pointed at their new homes. A clone without that commit (shallow)
  runs aiohttp alone and says so.

Figures per transport: requests/s (best and median of the rounds), CPU microseconds per
request of this process (all threads: the driver, the sender loop, its resolver threads;
`time.process_time`), and the per-request duration the transport reports (p50 / p99 ms). The
ratio aiohttp / framed is printed for throughput and CPU. The durable delivery path's figures
(>= 1,000 deliveries/s) come from bench/delivery_bench.py, which runs the pump and the database.
Public entry points only: the transport's `PostRequest` and `submit`. No database is used.
`--smoke`: 200 POSTs, one round, a warm-up of 100 (that the bench runs, not a figure).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, Procs, load_average  # noqa: E402
from delivery_bench import Sink  # noqa: E402

LOG_DIR = ROOT / "var" / "bench"
BODY = b'{"statusUpdate":{"taskId":"t","status":{"state":"TASK_STATE_WORKING"}}' + b" " * 530
HEADERS = {
    "Content-Type": "application/a2a+json",
    "X-A2A-Task-Id": "0b6f8f4e-5d7a-4f43-9d0b-6a1f7f0c2a11",
    "X-A2A-Task-Seq": "7",
    "X-A2A-Binding-Version": "cfg-1.v1",
    "X-A2A-Event-Kind": "status",
    "webhook-id": "5f0c7a52-3c3e-4d59-8f1e-2d3f4a5b6c7d",
    "webhook-timestamp": "1764000000",
    "webhook-signature": "v1a," + "A" * 86 + "==",
    "X-A2A-Notification-Token": "bench-token",
    "Authorization": "Bearer " + "x" * 400,
}


# Where the transport lived at a commit, newest first.
TRANSPORT_PATHS = ("webhooks/delivery/transport.py", "webhooks/transport.py")
# Modules the baseline imports that have moved since: old name -> new name.
MOVED = {"webhooks.ssrf": "webhooks.delivery.ssrf"}


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def load_baseline(commit: str):
    """The transport as it was at `commit`, imported as a module of its own; None when this
    clone does not have that commit."""
    path = next(
        (p for p in TRANSPORT_PATHS if _git("cat-file", "-e", f"{commit}:{p}").returncode == 0),
        None,
    )
    if path is None:
        return None
    source = _git("show", f"{commit}:{path}").stdout
    for old, new in MOVED.items():
        if importlib.util.find_spec(old) is None:
            package, _, name = old.rpartition(".")
            new_package, _, new_name = new.rpartition(".")
            source = source.replace(
                f"from {package} import {name}\n",
                f"from {new_package} import {new_name} as {name}\n",
            )
            source = source.replace(f"from {old} import", f"from {new} import")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    path = LOG_DIR / f"framed_transport_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("framed_transport", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def one_round(transport, url: str, requests: int, window: int) -> dict:
    """`requests` sends, `window` in flight, refilled as each finishes."""
    request = transport.PostRequest(url, BODY, HEADERS)
    durations: list[float] = []
    failures = 0
    pending: set[concurrent.futures.Future] = set()
    left = requests
    cpu0, t0 = time.process_time(), time.perf_counter()
    while left or pending:
        if left and len(pending) < window:
            batch = min(window - len(pending), left)
            pending.update(transport.submit([request] * batch, timeout=10))
            left -= batch
        done, pending = concurrent.futures.wait(
            pending, return_when=concurrent.futures.FIRST_COMPLETED
        )
        for future in done:
            result = future.result()
            if result.ok:
                durations.append(result.duration_ms)
            else:
                failures += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    durations.sort()
    return {
        "rps": requests / wall,
        "cpu_us": cpu / requests * 1e6,
        "p50": durations[len(durations) // 2] if durations else float("nan"),
        "p99": durations[int(len(durations) * 0.99)] if durations else float("nan"),
        "failures": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--window", type=int, default=64, help="sends in flight (pump window)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-commit", default="221e649")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny parameters, every phase run once: a check that the bench runs, not a figure",
    )
    args = parser.parse_args()
    warmup = 2000
    if args.smoke:
        args.requests, args.rounds, warmup = 200, 1, 100

    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "a2a_platform.settings",
            "A2A_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
            "LOG_LEVEL": "WARNING",
        }
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from webhooks.delivery import transport as aiohttp_transport

    # Both add User-Agent and Accept-Encoding themselves: the same request on the wire.
    implementations = {"aiohttp": aiohttp_transport}
    framed = load_baseline(args.baseline_commit)
    if framed is not None:
        implementations["framed"] = framed

    procs = Procs()
    try:
        sink = Sink(procs)
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        baseline = (
            f"baseline = the transport at {args.baseline_commit}"
            if framed is not None
            else f"NO baseline: commit {args.baseline_commit} is not in this clone (aiohttp alone)"
        )
        print(
            f"# webhook transport bench: {os.cpu_count()} cores shared with the sink; load avg "
            f"before {load_average()}; code {head}; {baseline}; {args.requests} POSTs of "
            f"{len(BODY)} bytes per round, {args.window} in flight, keep-alive to one origin"
        )
        for transport in implementations.values():  # warm up: connections, imports
            one_round(transport, sink.url, warmup, args.window)
        rounds: dict[str, list[dict]] = {name: [] for name in implementations}
        for _ in range(args.rounds):
            for name, transport in implementations.items():
                sink.reset()
                r = one_round(transport, sink.url, args.requests, args.window)
                rounds[name].append(r)
                print(
                    f"  {name}: {r['rps']:,.0f} req/s, {r['cpu_us']:.0f} us CPU/req, "
                    f"p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, failures {r['failures']}",
                    flush=True,
                )
        print()
        print(
            f"{'transport':<10} {'req/s best':>11} {'median':>8} {'us CPU/req':>11} "
            f"{'p50 ms':>7} {'p99 ms':>7}"
        )
        summary = {}
        for name, rs in rounds.items():
            best = max(r["rps"] for r in rs)
            median = statistics.median(r["rps"] for r in rs)
            cpu = statistics.median(r["cpu_us"] for r in rs)
            p50 = statistics.median(r["p50"] for r in rs)
            p99 = statistics.median(r["p99"] for r in rs)
            summary[name] = (median, cpu)
            print(f"{name:<10} {best:>11,.0f} {median:>8,.0f} {cpu:>11.0f} {p50:>7.2f} {p99:>7.2f}")
        if "framed" in summary:
            (a_rps, a_cpu), (f_rps, f_cpu) = summary["aiohttp"], summary["framed"]
            cpu_ratio = f"x{a_cpu / f_cpu:.2f}" if f_cpu else "n/a"
            print(
                f"\naiohttp / framed: throughput x{a_rps / f_rps:.2f}, CPU per request "
                f"{cpu_ratio} (medians of {args.rounds} rounds)"
            )
        print(f"# load average at the end {load_average()}")
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
