"""Protocol throughput and latency (figures, never assertions).

Starts a fresh PostgreSQL database, one uvicorn web process, a Celery worker on every queue
(the echo agent's executor, deliveries, heartbeats) and beat, waits until the platform is
ready (the card is served only then), then drives load from a separate process on loopback
with `wrk` (Debian package `wrk`):

    .venv/bin/python bench/protocol_bench.py [--duration 10] [--web-workers 1]
        [--database NAME] [--smoke]

Reports req/s and p50/p99 for the agent card, GetTask, blocking SendMessage (the echo
executor completes the task on the worker) and SendMessage with returnImmediately, at
concurrency 16 and 64. Both client and server share this machine's cores; each line ends
with the 1-minute load average. The database (--database, default `a2a_bench`) is created
afresh on A2A_BENCH_PG's server. The blocking and returnImmediately figures are the echo
executor's (its quick path: the doorbell, the drain job, the answer from the claim's row);
another executor's tasks take the executor job per task. `--smoke`: 1 s per run, at
concurrency 16 only (that the bench runs, not a figure).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ECHO_AGENT,
    Procs,
    add_common_args,
    free_port,
    fresh_database,
    load_average,
    manage,
    purge_broker,
)

HERE = Path(__file__).resolve().parent
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def wrk_ms(text: str) -> float:
    """A wrk latency ("870.00us", "1.20ms", "2.00s") in milliseconds."""
    m = re.match(r"([\d.]+)(us|ms|s|m)", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")


def wrk(
    url: str,
    concurrency: int,
    duration: float,
    *,
    script: str | None = None,
    headers: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    cmd = ["wrk", "-t2", f"-c{concurrency}", f"-d{duration:.0f}s", "--latency", "--timeout", "60s"]
    for k, v in (headers or {}).items():
        cmd += ["-H", f"{k}: {v}"]
    if script:
        cmd += ["-s", script]
    out = subprocess.run(
        cmd + [url], capture_output=True, text=True, env={**os.environ, **(env or {})}, check=True
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    # Anchored: the thread stats line above ends in a percentage like "75.50%" too.
    p50 = wrk_ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1))
    p99 = wrk_ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(bad.group(1)) if bad else 0
    sock = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": rps,
        "p50": p50,
        "p99": p99,
        "requests": total,
        "errors": errors,
        "socket": sock.group(1) if sock else "",
    }


def show(name: str, concurrency: int, r: dict) -> None:
    print(
        f"{name:<32} c={concurrency:<3} {r['rps']:>8.0f} req/s  p50 {r['p50']:>8.1f} ms  "
        f"p99 {r['p99']:>8.1f} ms  ({r['requests']} requests, {r['errors']} non-2xx"
        f"{', socket errors ' + r['socket'] if r['socket'] else ''}); load {load_average()}",
        flush=True,
    )


def drain_queue(db: str, timeout: float = 120) -> None:
    """Wait until the worker has finished every task, so runs do not disturb each other."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(db, autocommit=True) as conn:
        while time.monotonic() < deadline:
            left = conn.execute(
                "SELECT count(*) FROM tasks_executordispatch WHERE state IN ('pending','claimed')"
            ).fetchone()[0]
            if not left:
                return
            time.sleep(0.5)


def wait_ready(base: str, timeout: float = 60) -> None:
    """Until /readyz answers 200 (the first heartbeat has proved the worker end to end)."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
            return
        time.sleep(0.5)
    sys.exit(f"the platform did not become ready: {httpx.get(f'{base}/readyz').text}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--web-workers", type=int, default=1)
    add_common_args(parser, "a2a_bench")
    args = parser.parse_args()
    concurrencies = (16, 64)
    if args.smoke:
        args.duration, concurrencies = 1.0, (16,)
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed: apt-get install wrk")

    db = fresh_database(args.database)
    manage(db, *ECHO_AGENT)
    token = manage(db, "create_api_key", "bench", "--name", "bench").splitlines()[-1]
    auth = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
    purge_broker()
    procs = Procs()
    port = free_port()
    try:
        procs.web(db, port, workers=args.web_workers)
        procs.celery_worker(db, "pw", queues="agents,webhooks,heartbeat", concurrency=2)
        procs.beat(db)
        base = f"http://127.0.0.1:{port}"
        wait_ready(base)
        print(
            f"# protocol bench: {os.cpu_count()} cores shared by wrk, web (x{args.web_workers})"
            f", worker and PostgreSQL; {args.duration:.0f} s per run; load average "
            f"{load_average()}"
        )
        import httpx

        seed = httpx.post(
            f"{base}/message:send",
            headers=auth,
            json={"message": {"messageId": "seed", "role": "ROLE_USER", "parts": [{"text": "x"}]}},
            timeout=30,
        ).json()
        if "task" not in seed:
            sys.exit(f"seeding failed: {seed}")
        seed = seed["task"]["id"]
        script = str(HERE / "send_message.lua")
        for c in concurrencies:
            show("agent card", c, wrk(f"{base}/.well-known/agent-card.json", c, args.duration))
        for c in concurrencies:
            show("GetTask", c, wrk(f"{base}/tasks/{seed}", c, args.duration, headers=auth))
        for c in concurrencies:
            drain_queue(db)
            r = wrk(
                f"{base}/message:send",
                c,
                args.duration,
                script=script,
                env={"A2A_TOKEN": token, "A2A_BLOCKING": "1", "A2A_RUN": f"b{c}"},
            )
            show("SendMessage blocking (echo)", c, r)
        for c in concurrencies:
            drain_queue(db)
            r = wrk(
                f"{base}/message:send",
                c,
                args.duration,
                script=script,
                env={"A2A_TOKEN": token, "A2A_BLOCKING": "0", "A2A_RUN": f"i{c}"},
            )
            show("SendMessage returnImmediately", c, r)
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
