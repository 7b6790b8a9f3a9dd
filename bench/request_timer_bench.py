"""What the request timer behind `http_server_request_duration_seconds` adds to a request
(figures, never assertions): `request_metrics.timed` around a bare ASGI app that answers 200,
against the same app called directly, in microseconds per call, in this process (no server,
no database: the timer's own work, which the end-to-end `observability_bench.py` cannot
resolve on a shared machine).

    .venv/bin/python bench/request_timer_bench.py [--calls 20000] [--rounds 5] [--smoke]

Each figure is the median of --rounds rounds of --calls calls. `--smoke`: 200 calls, one round
(that it runs, not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")

import django  # noqa: E402

django.setup()

from a2a_platform import request_metrics  # noqa: E402

SCOPE = {"type": "http", "method": "POST", "path": "/message:send", "route": "/message:send"}


async def app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def receive() -> dict:
    return {"type": "http.request", "body": b"", "more_body": False}


async def send(message) -> None:
    return None


async def per_call(call, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        await call()
    return (time.perf_counter() - started) / calls * 1e6


async def measure(calls: int, rounds: int) -> dict[str, float]:
    ways = {
        "bare": lambda: app(SCOPE, receive, send),
        "timed": lambda: request_metrics.timed(app, SCOPE, receive, send),
    }
    figures: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, call in ways.items():
            figures[name].append(await per_call(call, calls))
    return {name: statistics.median(values) for name, values in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny: that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.rounds = 200, 1
    figures = asyncio.run(measure(args.calls, args.rounds))
    print(f"µs per call, median of {args.rounds} round(s) of {args.calls} calls")
    print(f"bare ASGI call   {figures['bare']:.2f}")
    print(f"timed            {figures['timed']:.2f}")
    print(f"timer adds       {figures['timed'] - figures['bare']:.2f}")


if __name__ == "__main__":
    main()
