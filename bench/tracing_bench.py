"""What traces cost with span export off (figures, never assertions): the per-call cost of the
trace context work on the hot paths, with propagation on (the default) and off
(`OTEL_PROPAGATORS=none`), and what importing the SDK and the instrumentations would cost a
process that does not export (it does not import them).

    .venv/bin/python bench/tracing_bench.py [--calls 20000] [--rounds 5] [--smoke]

In this process, no database, no network (a2a_platform/lib/tracing.py's calls alone):

- **request + new task**: a protocol request's `server_request` (the caller's `traceparent`
  read by the global propagator, made current) and `new_task_trace` (the task's context
  formatted for storage), as SendMessage runs them; with and without a `traceparent` header;
- **request alone**: `server_request` with no header (every other protocol request);
- **delivery headers**: `inject_task_trace` of a stored context into a delivery's headers
  (the context already parsed, as for a task's later deliveries: a process parses each
  recent task's context once; the first delivery pays about what **run or attempt** does);
- **run or attempt**: `task_span` with export off (the stored context made current, for log
  lines).

Each figure is the median of --rounds rounds of --calls calls, in microseconds per call, next
to the same with the global propagator emptied as OTEL_PROPAGATORS=none does. The import
figure is a fresh interpreter's `import` of the SDK's trace module and the four
instrumentations, median of three. `--smoke`: 200 calls, one round, one import (that it runs,
not a figure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")

from opentelemetry import propagate  # noqa: E402
from opentelemetry.propagators.composite import CompositePropagator  # noqa: E402
from starlette.datastructures import Headers  # noqa: E402

from a2a_platform.lib import tracing  # noqa: E402

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
WITH_HEADER = Headers({"traceparent": PARENT, "tracestate": STATE, "a2a-version": "1.0"})
WITHOUT = Headers({"a2a-version": "1.0", "content-type": "application/json"})


def request_and_task(headers: Headers) -> None:
    with tracing.server_request(headers, "A2A SendMessage", {}):
        tracing.new_task_trace()


def request_alone() -> None:
    with tracing.server_request(WITHOUT, "A2A GetTask", {}):
        pass


def delivery_headers() -> None:
    tracing.inject_task_trace({"webhook-id": "x"}, PARENT, STATE)


def run_span() -> None:
    with tracing.task_span("executor run", PARENT, STATE, {}):
        pass


CASES = {
    "request + new task, traceparent sent": lambda: request_and_task(WITH_HEADER),
    "request + new task, none sent": lambda: request_and_task(WITHOUT),
    "request alone": request_alone,
    "delivery headers": delivery_headers,
    "run or attempt": run_span,
}


def per_call_us(fn, calls: int, rounds: int) -> float:
    figures = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        figures.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(figures)


def import_ms(runs: int) -> float:
    code = (
        "import time; t = time.perf_counter(); "
        "import opentelemetry.sdk.trace, opentelemetry.sdk.trace.export; "
        "import opentelemetry.exporter.otlp.proto.http.trace_exporter; "
        "import opentelemetry.instrumentation.django, opentelemetry.instrumentation.celery; "
        "import opentelemetry.instrumentation.psycopg; "
        "import opentelemetry.instrumentation.aiohttp_client; "
        "print((time.perf_counter() - t) * 1000)"
    )
    return statistics.median(
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
        for _ in range(runs)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny: that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.rounds = 200, 1
    assert not tracing.exporting()
    configured = propagate.get_global_textmap()
    print(f"export off; µs per call, median of {args.rounds} rounds of {args.calls} calls")
    print(f"{'':40} {'propagating':>12} {'none':>8}")
    for name, fn in CASES.items():
        on = per_call_us(fn, args.calls, args.rounds)
        propagate.set_global_textmap(CompositePropagator([]))
        try:
            off = per_call_us(fn, args.calls, args.rounds)
        finally:
            propagate.set_global_textmap(configured)
        print(f"{name:40} {on:12.2f} {off:8.2f}")
    imported = import_ms(1 if args.smoke else 3)
    print(f"importing the SDK and the instrumentations (not done when off): {imported:.0f} ms")


if __name__ == "__main__":
    main()
