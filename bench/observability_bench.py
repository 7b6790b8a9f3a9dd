"""What metrics and trace propagation cost on the hot paths: SendMessage, GetTask and webhook
delivery, each measured with both on and both off in one run, interleaved (figures, never
assertions).

    .venv/bin/python bench/observability_bench.py [--seconds 5] [--rounds 3]
        [--concurrency 8] [--tasks 100] [--scrape-interval 5] [--history 0]
        [--server-env NAME=VALUE ...] [--database NAME] [--smoke]

What runs: a database of the bench's own (--database, default `a2a_bench_observability`, on
A2A_BENCH_PG's server, created afresh) with the echo agent at the root and a client API key;
two uvicorn web processes on it, identical but for their switches (`on`: metrics on, requests
timed and flushed to the shared histogram, /metrics scraped every --scrape-interval seconds
while that side is measured, as a Prometheus would (0: not during the phases, to see the hot
paths' cost alone), and W3C propagation on (the default `OTEL_PROPAGATORS`); `off`:
`A2A_METRICS_ENABLED=false` and `OTEL_PROPAGATORS=none`: no timing, no /metrics, no scrape, no
trace context read or stored). Span export is off on both. Every send carries a client's
`traceparent` and `tracestate`, the costlier case for propagation; one
Celery worker (agents, webhooks, heartbeat; threads, 8) and beat, as `make run` has them; a
sink answering every webhook 200 (bench/sink.py).

Phases, after an unmeasured warm-up of each on both sides, each run --rounds times with `on`
and `off` alternating (which goes first swaps every round, so a drift of the shared machine
falls on both):

- **send**: `POST /message:send` returnImmediately, --concurrency clients for --seconds;
- **get**: `GET /tasks/{id}` of a completed echo task, the same way;
- **delivery**: --tasks sends with an inline push config to the sink, then until every
  delivery they owe has reached it: deliveries per second from the first send to the last
  receipt (the worker records each attempt's outcome and latency with or without metrics:
  that write is part of both sides).

Printed: per phase and side the medians of the rounds (req/s, p50, p99, and the web
process's CPU per request from /proc: the figure least moved by other load on a shared
machine; for delivery, per delivery, the receiving web process's share), the on/off ratios,
and the scrape's own cost (its median wall time and the rows it aggregated), again after
--history more attempt and status-event rows (copies of the run's, inserted in SQL: a setup
shortcut to a retention window's size). --server-env
adds an environment variable to both web processes and the worker (repeatable), e.g.
`OTEL_PROPAGATORS=none`, to compare other switches the same way. `--smoke`: 1 s phases, one
round, 5 tasks (that the bench runs, not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ECHO_AGENT,
    ROOT,
    Procs,
    add_common_args,
    free_port,
    fresh_database,
    load,
    load_average,
    platform_env,
)
from delivery_bench import Sink, cpu_seconds  # noqa: E402

DATABASE = "a2a_bench_observability"
ALLOWED = {"A2A_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}
# Each side's web environment: `on` has metrics and W3C propagation (the defaults), `off`
# neither (tracing export is off on both, as the issue's target asks).
SIDES = {
    "on": {"A2A_METRICS_ENABLED": "true"},
    "off": {"A2A_METRICS_ENABLED": "false", "OTEL_PROPAGATORS": "none"},
}
# Every send carries a caller's trace context, as a traced client's does: the costlier case
# for propagation (the header is parsed and stored; without one a trace id is generated).
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PHASES = ("send", "get", "delivery")
OWED = """
SELECT (SELECT count(*) FROM tasks_task t JOIN webhooks_pushconfig p ON p.task_id = t.id
        WHERE t.state IN ('TASK_STATE_SUBMITTED', 'TASK_STATE_WORKING'))
     + (SELECT count(*) FROM webhooks_delivery WHERE state IN ('pending', 'sending'))
"""


def _body(message_id: str, push_url: str | None = None) -> dict:
    configuration: dict = {"returnImmediately": True}
    if push_url:
        configuration["taskPushNotificationConfig"] = {"id": "bench", "url": push_url}
    message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": "hello"}]}
    return {"message": message, "configuration": configuration}


def _sql(url: str, query: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchone()[0]


def _wait_ready(base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{base}/readyz", timeout=5).status_code != 200:
        if time.monotonic() > deadline:
            raise SystemExit(f"{base} not ready in {timeout}s (worker and beat running?)")
        time.sleep(0.2)


class Scraper:
    """A Prometheus stand-in: GET /metrics every `interval` s while running; keeps durations."""

    def __init__(self, base: str, interval: float) -> None:
        self.base, self.interval = base, interval
        self.durations: list[float] = []
        self.task: asyncio.Task | None = None

    async def _run(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=60) as client:
            while True:
                started = time.perf_counter()
                response = await client.get("/metrics")
                if response.status_code != 200:
                    raise SystemExit(f"/metrics answered {response.status_code}")
                self.durations.append(time.perf_counter() - started)
                await asyncio.sleep(self.interval)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None


async def _phase(phase: str, side: str, args, ctx: dict) -> dict:
    """One measured phase against one side's web process; with its CPU per request."""
    pid = ctx["pids"][side]
    cpu = cpu_seconds([pid])
    result = await _drive(phase, ctx["bases"][side], args, ctx)
    result["cpu_ms"] = (cpu_seconds([pid]) - cpu) / max(result["requests"], 1) * 1000
    return result


async def _drive(phase: str, base: str, args, ctx: dict) -> dict:
    auth = {"Authorization": f"Bearer {ctx['token']}", "A2A-Version": "1.0"}
    traced = {**auth, "traceparent": TRACEPARENT, "tracestate": "vendor=bench"}
    if phase == "send":

        async def call(client, n):
            body = _body(f"s-{base}-{n}")
            return await client.post("/message:send", headers=traced, json=body)

        return await load(call, concurrency=args.concurrency, duration=args.seconds, base_url=base)
    if phase == "get":
        path = f"/tasks/{ctx['task_id']}"

        async def call(client, n):
            return await client.get(path, headers=auth)

        return await load(call, concurrency=args.concurrency, duration=args.seconds, base_url=base)
    # delivery: --tasks sends with a push config, then until the sink has every delivery.
    sink: Sink = ctx["sink"]
    ctx["batch"] = ctx.get("batch", 0) + 1
    before = sink.stats()["unique"]
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        queue = list(range(args.tasks))

        async def sender() -> None:
            while queue:
                n = queue.pop()
                body = _body(f"d-{ctx['batch']}-{n}", sink.url)
                response = await client.post("/message:send", headers=traced, json=body)
                if response.status_code != 200:
                    raise SystemExit(f"send: {response.status_code} {response.text[:300]}")

        await asyncio.gather(*(sender() for _ in range(args.concurrency)))
    # Every task with a push config answered and nothing owed: this batch all arrived.
    while _sql(ctx["url"], OWED):
        await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - started
    got = sink.stats()["unique"] - before
    return {"requests": got, "errors": 0, "rps": got / elapsed, "p50_ms": 0.0, "p99_ms": 0.0}


async def _bench(args, ctx: dict) -> None:
    scraper = Scraper(ctx["bases"]["on"], args.scrape_interval)
    # Warm-up, unmeasured: both processes' connections, prepared statements and caches.
    warm = argparse.Namespace(**{**vars(args), "seconds": min(args.seconds, 2.0)})
    for phase in PHASES:
        for side in SIDES:
            await _phase(phase, side, warm, ctx)
    results: dict[tuple[str, str], list[dict]] = {}
    for round_no in range(args.rounds):
        sides = ("on", "off") if round_no % 2 == 0 else ("off", "on")
        for phase in PHASES:
            for side in sides:
                if side == "on" and args.scrape_interval > 0:
                    scraper.start()
                try:
                    result = await _phase(phase, side, args, ctx)
                finally:
                    await scraper.stop()
                results.setdefault((phase, side), []).append(result)
                print(
                    f"  round {round_no + 1} {phase:8} {side:3}: {result['rps']:8.1f}/s  "
                    f"p50 {result['p50_ms']:6.2f} ms  p99 {result['p99_ms']:6.2f} ms  "
                    f"web CPU {result['cpu_ms']:.3f} ms/req  "
                    f"({result['requests']}, {result['errors']} errors, load {load_average()})",
                    flush=True,
                )

    def median(phase: str, side: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(phase, side)])

    print(
        f"\nMetrics and propagation on / off, medians of {args.rounds} round(s), "
        f"c={args.concurrency}"
    )
    for phase in PHASES:
        for side in ("on", "off"):
            print(
                f"{phase:8} {side:3} {median(phase, side, 'rps'):9.1f}/s  "
                f"p50 {median(phase, side, 'p50_ms'):7.2f} ms  "
                f"p99 {median(phase, side, 'p99_ms'):7.2f} ms  "
                f"web CPU {median(phase, side, 'cpu_ms'):.3f} ms/req"
            )
        ratio = median(phase, "on", "rps") / median(phase, "off", "rps")
        cpu = median(phase, "on", "cpu_ms") / median(phase, "off", "cpu_ms")
        line = f"{phase:8} on/off: throughput x{ratio:.3f}, web CPU per request x{cpu:.3f}"
        if phase != "delivery":
            p50 = median(phase, "on", "p50_ms") / median(phase, "off", "p50_ms")
            p99 = median(phase, "on", "p99_ms") / median(phase, "off", "p99_ms")
            line += f", p50 x{p50:.3f}, p99 x{p99:.3f}"
        print(line)
    errors = sum(r["errors"] for rows in results.values() for r in rows)
    print(f"errors: {errors}")

    # The scrape's own cost: on the rows this run wrote, then with --history more.
    await _scrape_cost(ctx, scraper.durations)
    if args.history:
        _grow(ctx["url"], args.history)
        await _scrape_cost(ctx, [])
    print(f"# load average at the end {load_average()}")


async def _scrape_cost(ctx: dict, durations: list[float]) -> None:
    rows = {
        table: _sql(ctx["url"], f"SELECT count(*) FROM {table}")
        for table in ("webhooks_deliveryattempt", "tasks_taskevent", "tasks_task")
    }
    async with httpx.AsyncClient(base_url=ctx["bases"]["on"], timeout=120) as client:
        for _ in range(5):
            started = time.perf_counter()
            (await client.get("/metrics")).raise_for_status()
            durations.append(time.perf_counter() - started)
    print(
        f"scrape: median {statistics.median(durations) * 1000:.1f} ms over "
        f"{len(durations)} scrapes; rows: " + ", ".join(f"{table} {n}" for table, n in rows.items())
    )


def _grow(url: str, n: int) -> None:
    """Setup shortcut for the scrape's cost at a retention window's size: `n` more delivered
    attempts and `n` more status events, copies of the rows the run wrote (on its tasks and
    deliveries, so every join the scrape makes meets them), then VACUUM ANALYZE."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO webhooks_deliveryattempt (delivery_id, number, url, started_at,
                duration_ms, status, error_class, response_excerpt, request_headers, manual,
                error_detail, outcome, latency_us)
            SELECT a.delivery_id, a.number + g, a.url, a.started_at, a.duration_ms, a.status,
                a.error_class, a.response_excerpt, a.request_headers, a.manual, a.error_detail,
                a.outcome, a.latency_us
            FROM (SELECT * FROM webhooks_deliveryattempt WHERE outcome = 'delivered' LIMIT 1000) a,
                 generate_series(1, %(per)s) g
            """,
            {"per": max(1, n // 1000)},
        )
        seq = conn.execute("SELECT coalesce(max(seq), 0) FROM tasks_taskevent").fetchone()[0]
        conn.execute(
            """
            INSERT INTO tasks_taskevent (task_id, seq, kind, payload, created_at)
            SELECT e.task_id, %(seq)s + row_number() OVER (), e.kind, e.payload, e.created_at
            FROM (SELECT * FROM tasks_taskevent WHERE kind = 'status' LIMIT 1000) e,
                 generate_series(1, %(per)s) g
            """,
            {"per": max(1, n // 1000), "seq": seq},
        )
        conn.execute("VACUUM ANALYZE webhooks_deliveryattempt")
        conn.execute("VACUUM ANALYZE tasks_taskevent")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5, help="each send/get phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=100, help="tasks per delivery phase")
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=5,
        help="seconds between scrapes while `on` is measured; 0: none (the hot paths alone)",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="then add this many attempt and event rows and measure the scrape again",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the web processes and the worker (repeatable)",
    )
    add_common_args(parser, DATABASE)
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds, args.tasks, args.scrape_interval = 1, 1, 5, 0.5
        args.history = min(args.history, 2000)
    extra = dict(item.split("=", 1) for item in args.server_env)

    url = fresh_database(args.database)
    env = platform_env(url, ALLOWED_HOSTS="127.0.0.1,localhost")
    run = {"cwd": ROOT, "env": env, "check": True, "capture_output": True, "text": True}
    subprocess.run([sys.executable, "manage.py", *ECHO_AGENT], **run)
    key = subprocess.run(
        [sys.executable, "manage.py", "create_api_key", "bench", "--name", "bench"], **run
    ).stdout.strip()
    token = key.splitlines()[-1]

    procs = Procs()
    try:
        sink = Sink(procs)
        quiet = {"LOG_LEVEL": "WARNING", "A2A_JOB_LOG_LEVEL": "WARNING", **ALLOWED, **extra}
        procs.celery_worker(
            url,
            "obs-worker",
            queues="agents,webhooks,heartbeat",
            pool="threads",
            concurrency=8,
            **{**quiet, "LOG_LEVEL": "INFO"},  # the readiness wait reads its `ready.` line
        )
        procs.beat(url, **quiet)
        bases, pids = {}, {}
        for side, side_env in SIDES.items():
            port = free_port()
            procs.web(url, port, name=f"obs-web-{side}", **side_env, **quiet)
            bases[side] = f"http://127.0.0.1:{port}"
            pids[side] = procs.procs[-1].pid
        for base in bases.values():
            _wait_ready(base)
        # A completed echo task for GetTask.
        answer = httpx.post(
            f"{bases['off']}/message:send",
            headers={"Authorization": f"Bearer {token}", "A2A-Version": "1.0"},
            json={**_body("seed"), "configuration": {"returnImmediately": False}},
            timeout=30,
        )
        answer.raise_for_status()
        task_id = json.loads(answer.text)["task"]["id"]
        print(
            f"# {args.rounds} round(s); send/get {args.seconds:g} s at c={args.concurrency}; "
            f"delivery {args.tasks} tasks; scrape every {args.scrape_interval:g} s (on); "
            f"server env {extra or '-'}; load average {load_average()}",
            flush=True,
        )
        ctx = {"url": url, "token": token, "task_id": task_id, "sink": sink, "bases": bases}
        ctx["pids"] = pids
        asyncio.run(_bench(args, ctx))
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
