"""Every benchmark in bench/ runs at the head: each is started as its docs say, with `--smoke`
(tiny parameters, every phase run once), and must exit 0 having printed its figure lines.

What is asserted is that the bench ran through and reported, never a timing value: a rename
of a function a bench calls, a changed signature, a moved module or a figure that stopped
being printed fails here, in `make test`, instead of in the next person's benchmark run.
The few functional facts a figure line states are asserted too where a wrong value means a
broken bench rather than a slow machine (every event delivered, the platform's load runs
answered without a non-2xx, one NOTIFY per transaction).

Each bench creates its own database afresh on the test database's server, named after it
(`<name of DATABASE_URL>_bench_<bench>`, dropped afterwards), and uses the test broker (its
Redis database is emptied after each bench, as after a test's processes). protocol_bench and
sdk_compare drive load with `wrk` (Debian's package: `make test` installs it when it can);
sdk_compare and hosted_bench also start a PostgreSQL server of their own (Debian's postgresql
binaries).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.conf import settings

from tests.processes import forget_broker_state

pytestmark = [pytest.mark.slow, pytest.mark.bench]

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# A smoke bench that runs longer than this is stuck (each takes well under a minute).
TIMEOUT = 240
# The benches whose database lives on a PostgreSQL server of their own (initdb'd and removed
# by the bench), not on the test database's server.
OWN_SERVER = {"sdk_compare.py", "hosted_bench.py"}


def _server() -> tuple[str, str]:
    """(server URL without a database, the database's name) of the suite's DATABASE_URL: the
    benches create their databases beside the test database, on the same server."""
    url = os.environ.get("DATABASE_URL", "")
    parsed = urlparse(url)
    if not parsed.scheme.startswith("postgres"):
        pytest.fail(f"the benches need PostgreSQL: DATABASE_URL is {url!r} (make test sets it)")
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/") or "a2a_platform"


def _drop(server: str, name: str) -> None:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_bench(script: str, *args: str, database: str | None = None) -> str:
    """Run bench/<script> --smoke as its docstring says; its output (stdout and stderr)."""
    server, base = _server()
    name = f"{base}_bench_{database}" if database else None
    env = dict(os.environ)
    env.update(
        {
            "A2A_BENCH_PG": server,
            "A2A_BENCH_BROKER_URL": settings.CELERY_BROKER_URL,
            "A2A_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
            "PYTHONUNBUFFERED": "1",
        }
    )
    cmd = [sys.executable, str(BENCH / script), "--smoke", *args]
    if name:
        cmd += ["--database", name]
    forget_broker_state()
    try:
        done = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
    finally:
        forget_broker_state()
        if name and script not in OWN_SERVER:
            _drop(server, name)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{out[-6000:]}"
    return out


def expect(out: str, *patterns: str) -> None:
    """Each pattern (a regex) matches a line of the output."""
    missing = [p for p in patterns if not re.search(p, out, re.M)]
    assert not missing, f"figure lines missing: {missing}\n--- output ---\n{out[-6000:]}"


def test_answer_bench():
    out = run_bench("answer_bench.py", database="answer")
    number = r"[\d.]+ ms"
    for way in ("answer, claim's row", "answer, locked", "three services", "the worker's batches"):
        expect(
            out,
            rf"^  {re.escape(way)} +per answer \(median\): Python CPU {number}, "
            rf"PostgreSQL CPU {number}, wall {number}",
        )
    expect(
        out,
        r"^# answer, claim's row / answer, locked: Python ",
        r"^# answer, locked / three services: Python ",
        r"^# load average at the end [\d.]+$",
    )


def test_tracing_bench():
    out = run_bench("tracing_bench.py")
    for figure in (
        "request + new task, traceparent sent",
        "request + new task, none sent",
        "request alone",
        "delivery headers",
        "run or attempt",
    ):
        expect(out, rf"^{re.escape(figure)} +[\d.]+ +[\d.]+$")
    expect(out, r"^importing the SDK and the instrumentations \(not done when off\): \d+ ms$")


def test_request_timer_bench():
    out = run_bench("request_timer_bench.py")
    for figure in ("bare ASGI call", "timed", "timer adds"):
        expect(out, rf"^{re.escape(figure)} +-?[\d.]+$")


def test_web_bench():
    out = run_bench("web_bench.py", database="web")
    for figure in ("agent card", "GetTask", "SendMessage returnImmediately"):
        expect(out, rf"^  {figure} +per request \(median\): web CPU [\d.]+ ms, PostgreSQL CPU")
    expect(out, r"^# load average at the end [\d.]+$")


def test_transport_bench():
    out = run_bench("transport_bench.py")
    expect(out, r"^  aiohttp: [\d,]+ req/s, \d+ us CPU/req, .*failures 0$", r"^aiohttp +[\d,]+ ")
    baseline = subprocess.run(
        ["git", "cat-file", "-e", "221e649^{commit}"], cwd=ROOT, capture_output=True
    )
    if baseline.returncode == 0:  # the hand-framed transport it replaced, read from git
        expect(out, r"^  framed: [\d,]+ req/s", r"^aiohttp / framed: throughput x[\d.]+")
    else:
        expect(out, r"NO baseline: commit 221e649 is not in this clone")


def test_protocol_bench():
    out = run_bench("protocol_bench.py", database="protocol")
    for figure in (
        "agent card",
        "GetTask",
        "SendMessage blocking (echo)",
        "SendMessage returnImmediately",
    ):
        expect(
            out,
            rf"^{re.escape(figure)} +c=16 +\d+ req/s +p50 +[\d.]+ ms +p99 +[\d.]+ ms +"
            r"\(\d+ requests, 0 non-2xx\); load [\d.]+$",
        )


def test_stream_bench():
    out = run_bench("stream_bench.py", database="stream")
    assert "MISSING" not in out, out[-4000:]
    expect(
        out,
        r"^  commit → stream on A, +1 stream\(s\): p50 ",
        r"^  commit → stream on B, +5 stream\(s\): p50 ",
        r"^ +40 open streams .* one event to all: last after \d+ ms",
        r"^  one transaction, 10 events on one task: 1 notification\(s\)$",
        r"^  1 committer\(s\), with NOTIFY +\d+ event writes/s",
        r"^  4 committer\(s\), without NOTIFY +\d+ event writes/s",
        r"^  4 committer\(s\): NOTIFY changes the event write's throughput by [-+][\d.]+ %$",
    )


def test_delivery_bench():
    out = run_bench("delivery_bench.py", database="delivery")
    expect(
        out,
        r"^  drain batch 1 x1: \S+/s \(20/20, load [\d.]+\)$",
        r"^  live batch 50 x1: \S+/s \(50/50, load [\d.]+\)$",
        r"^Durable delivery throughput",
        r"^producer cost \(drain runs, no webhooks worker\): [\d.]+ ms CPU/event",
        r"^durable, 1 worker +\d+ ",
        r"^fire-and-forget baseline \(no worker\) +\d+ ",
        r"^# load average at the end [\d.]+$",
    )
    assert "!! stalled" not in out, out[-4000:]
    assert "deliver jobs raised" not in out, out[-4000:]


def test_rebind_bench():
    out = run_bench("rebind_bench.py", "--profile", database="rebind")
    expect(
        out,
        r"^  drain round 1: plan [\d.]+ s, complete [\d.]+ s \(completed\), last notice ",
        r"^Drain of 20 in-flight tasks",
        r"^1 +[\d.]+ +yes +20 ",  # round 1: planned, 20 moves
        r"^  rebind_start +1 x ",
        r"^  rebind_advance +\d+ x ",
        r"^Round 1: statements run by rebind_start \(planning\), \d+ in ",
        r"^EXPLAIN ANALYZE of the slowest SELECTs",
        r"^  A  no rebind +events/s: ",
        r"^  B2 open drain, notices undelivered \(held path\) +events/s: .* ratio B2/A ",
        r"^  B2: rows the transitions wrote .*'held': \d+.*'notice_pending'",
    )
    assert "deliveries still open after the rebind" not in out, out[-4000:]


def test_sdk_compare():
    out = run_bench("sdk_compare.py", database="sdk")
    expect(
        out,
        r"^# the platform \(PostgreSQL, durable\)$",
        r"^# the official SDK's server \(memory task store\)$",
        r"^  staging: ready; history \d+ tasks sent",
        r"^# this round: platform / SDK in-memory \(target\)$",
        r"^# spread over 1 round\(s\): min / median / max; void runs left out$",
    )
    quick = re.escape(" [echo quick path]")
    for figure, mark in (
        ("agent card", ""),
        ("GetTask", ""),
        ("SendMessage blocking (echo)", quick),
        ("SendMessage returnImmediately", quick),
        ("echo tasks completed /s", quick),
    ):
        name = re.escape(figure) + mark
        # Both servers' figures, the ratio (or why it is void), the spread.
        assert len(re.findall(rf"^  {name} +\d+ ", out, re.M)) == 2, (figure, out[-6000:])
        expect(out, rf"^  {name} +(\d+\.\d+x|void: .+) +\(target ", rf"^  {name} +platform ")
    # The platform's own runs answered every request (a VOID on the SDK's side is its own).
    platform = out.split("# the official SDK's server")[0]
    assert "  VOID (" not in platform, platform[-6000:]


def test_hosted_bench():
    out = run_bench("hosted_bench.py", database="hosted")
    expect(
        out,
        r"^# \d+ cores; .* the platform's worker -P \S+ -c \d+, A2A_HOSTED_CONCURRENCY ",
        r"^# the platform \(PostgreSQL, durable\)$",
        r"^# the official SDK's server \(memory task store\)$",
        r"^# this round: platform / SDK in-memory \(target\)$",
        r"^# spread over 1 round\(s\): min / median / max; void runs left out$",
        r"^# load average at the end [\d.]+$",
    )
    for figure, unit, target in (
        (r"time to all COMPLETED \(20 x 1 s\)", "s", r"<= 1\.5x"),
        (r"trivial tasks completed /s", "/s", r">= 0\.5x"),
    ):
        # Both servers' figures, the ratio (or why it is void), the spread.
        assert len(re.findall(rf"^  {figure} +[\d.]+ {unit} ", out, re.M)) == 2, (figure, out)
        short = figure.split(r" \(")[0]
        expect(out, rf"^  {short} +(\d+\.\d+x|void: .+) +\(target {target}\)$")
        expect(out, rf"^  {short} +platform .* ratio ")
    # The platform's tasks all ended COMPLETED with their artifact (the SDK's are its own).
    platform = out.split("# the official SDK's server")[0]
    assert "  VOID (" not in platform, platform[-6000:]


def test_observability_bench():
    out = run_bench("observability_bench.py", database="observability")
    for phase in ("send", "get", "delivery"):
        for side in ("on", "off"):
            expect(out, rf"^{phase} +{side} +[\d.]+/s +p50 ")
        expect(out, rf"^{phase} +on/off: throughput x[\d.]+")
    expect(
        out,
        r"^errors: 0$",
        r"^scrape: median [\d.]+ ms over \d+ scrapes; rows: webhooks_deliveryattempt \d+",
        r"^# load average at the end [\d.]+$",
    )
