"""The platform against the official a2a-sdk's own server, side by side in one run (figures only).

    .venv/bin/python bench/sdk_compare.py [--duration 15] [--warmup 3] [--connections 16]
                                          [--web-workers 1] [--workers 1] [--sdk-sqlite]
                                          [--worker-pool threads] [--worker-concurrency 8]
                                          [--pg-stats] [--no-pin] [--no-sdk]
                                          [--profile DIR] [--rounds 3] [--history 10]
                                          [--database NAME] [--smoke]

Scale-out: `--web-workers 2 --workers 2 --no-pin --no-sdk` (two web processes and two
worker processes against one PostgreSQL and one Redis, every process on every core).

`--rounds N` (default 3): N rounds, each the platform's figures and the SDK's, in alternating
order (the platform first, then the SDK first, and so on), each round's ratios printed
without a verdict, then per figure each server's req/s and the ratio as min / median / max
over the rounds. A verdict against the target is printed only from two valid rounds or
more, and says whether every round met it, none did, or they were mixed: one round on a
shared machine is no verdict. A machine whose speed drifts during a run moves a single
round's ratios; alternating rounds cancel a steady drift, and the spread shows how far to
trust the median.

What cannot mislead: a figure whose run saw non-2xx answers or socket errors (wrk's
"Non-2xx or 3xx responses", "Socket errors") is printed VOID, and its ratio as
"void: N non-2xx" instead of a number, left out of the spread; a server answering errors
fast is not faster. The figures marked "[echo quick path]" (SendMessage returnImmediately,
SendMessage blocking, echo tasks completed /s) are the platform's echo executor's: only it
takes the quick path (tasks/dispatch.py QUICK_EXECUTORS: one doorbell ring for the sends
committed together, a drain job answering ten tasks a claim from the claim's rows); an
agent with another executor takes one executor job per task, which these figures do not
measure.

Starts, one after the other on the same machine:
- the platform: a PostgreSQL server of the bench's own (initdb into a temporary directory,
  default durability: fsync and synchronous_commit on), uvicorn serving the ASGI app, a Celery
  worker on every queue (as the README runs it: -P threads -c 8) and beat, in the production
  profile (DEBUG off, caches on);
- the SDK: bench/sdk_server.py, its `DefaultRequestHandler` over `InMemoryTaskStore` (and,
  with --sdk-sqlite, over its SQLite `DatabaseTaskStore`), an echo agent in-process.

Both servers get the same staging (`staged_figures`): started, waited for until ready (the
platform: /readyz, once a worker's heartbeat proved it; the SDK: its card), --history
seconds of returnImmediately sends, not measured, so the figures run against a store in
use, not an empty one, then settled (every task sent so far finished: the platform's
dispatches, the SDK agent's completed counter at rest); each figure then gets a --warmup
run, the server settled again, and the measured run, from the same wrk command (the same
connections, the same headers: A2A-Version and a bearer token, the platform's API key or a
dummy one of the same shape that the SDK's server ignores). "echo tasks completed /s"
counts from the measured run's start until the server's backlog is finished, on both. On
the platform, once the history is in, the bench also runs `VACUUM ANALYZE`, as autovacuum
does on a database in use (the SDK's in-memory store has no statistics): the statements
each process prepares (its own and the foreign keys' checks) are then planned for tables of
their size. Without it (`--history 0`; the ANALYZE
still runs, on nearly empty tables) they are planned on nearly empty tables, whose plans (a
scan of the whole table) PostgreSQL keeps until autovacuum's next ANALYZE, a minute or more
into the run, while the tables grow by thousands of rows (docs/perf-log.md, "An empty
database's first minute; the card's header lines").

On a machine with two cores or more the server side (all its processes, PostgreSQL included)
is pinned to CPU 0 and the load generator, `wrk` (Debian package), to CPU 1. Each figure is a
closed loop of --connections connections for --duration seconds after a --warmup run. The
platform's figures are durable: the task, its events and its outbox rows are committed before
the answer that depends on them. Printed: req/s, p50/p99, the load generator's CPU use (it
must not be the bottleneck), each core's busy and stolen share during the run (steal: time
the hypervisor gave to others while the core had work; runs whose steal differs are not
the same machine), the 1-minute load average, and the platform/SDK ratio against the
targets of issue 19. `--database`: the database's name inside the bench's own PostgreSQL
server (default a2a_bench). `--smoke`: one round of 1 s runs without warm-up runs, after 1 s
of history (that the bench runs, not a figure).

`--profile DIR`: py-spy (pip install py-spy; it needs ptrace, so root or CAP_SYS_PTRACE)
samples each server process (a Celery worker with its pool children) through every measured
run, counting only samples that hold the GIL (Python running, not waiting); it writes the
collapsed stacks to DIR/<figure>-<role>.txt (flamegraph.pl and speedscope read them) and
prints each role's functions with the largest share of samples. Sampling costs CPU: read a
profiled run for where the time goes, not for throughput.

`--pg-stats`: pg_stat_statements in the bench's PostgreSQL. After each platform figure, the
statements that took PostgreSQL the most time in that figure's run alone, per request (calls
and milliseconds), and its transactions per request; at the end, the top statements of the
executor load and its drain.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from common import (  # noqa: E402
    ECHO_AGENT,
    ROOT,
    Procs,
    add_common_args,
    free_port,
    load_average,
    platform_env,
    purge_broker,
)
from protocol_bench import wait_ready, wrk_ms  # noqa: E402

HERE = Path(__file__).resolve().parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SEND = str(HERE / "send_message.lua")

# Issue 19's targets: the platform's figure over the SDK in-memory server's, in the same run.
TARGETS = {
    "SendMessage returnImmediately": 1.0,
    "GetTask": 1.0,
    "SendMessage blocking (echo)": 1.0,
    "echo tasks completed /s": 0.5,
    "agent card": 4.0,
}
# The platform's figures that only the echo executor's quick path reaches (tasks/dispatch.py
# QUICK_EXECUTORS: the sends committed together ring the doorbell once instead of publishing
# one executor job per task, a drain job claims ten due tasks in one statement and answers
# them from the claim's rows). An agent with another executor (scripted, conformance,
# external) takes one executor job per task: these figures say nothing about it.
QUICK_PATH = {
    "SendMessage returnImmediately",
    "SendMessage blocking (echo)",
    "echo tasks completed /s",
}
QUICK_MARK = " [echo quick path]"


def label(name: str) -> str:
    return name + QUICK_MARK if name in QUICK_PATH else name


def pinned(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None else []


@contextlib.contextmanager
def own_postgres(cpu: int | None, *, statements: bool = False):
    """A PostgreSQL server of the bench's own, pinned to `cpu`; yields its URL and the
    postmaster's pid."""
    root = Path(tempfile.mkdtemp(prefix="a2a-bench-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    port = free_port()
    subprocess.run(
        [*as_postgres, str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"],
        check=True,
        capture_output=True,
    )
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c max_connections=200"
    if statements:
        opts += " -c shared_preload_libraries=pg_stat_statements"
    subprocess.run(
        [*pinned(cpu), *as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-w"]
        + ["-l", str(root / "log"), "start"],
        check=True,
        capture_output=True,
    )
    try:
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        yield f"postgres://postgres@127.0.0.1:{port}", postmaster
    finally:
        subprocess.run(
            [*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def _stat(pid: int) -> tuple[int, int, float] | None:
    """(process group, parent, CPU seconds) of a process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[2]), int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_by_role(roles: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each role: the processes of a process group (web, worker,
    beat: each started in a session of its own) or, for PostgreSQL, the postmaster's
    children. Exited processes are not counted (none exit during a run)."""
    stats = {int(p): _stat(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    used = dict.fromkeys(roles, 0.0)
    for pid, stat in stats.items():
        if stat is None:
            continue
        group, parent, seconds = stat
        for role, leader in roles.items():
            if group == leader or pid == leader or parent == leader:
                used[role] += seconds
                break
    return used


def core_times() -> dict[str, list[int]]:
    """Each core's time so far, in ticks, from /proc/stat: user, nice, system, idle, iowait,
    irq, softirq, steal."""
    lines = Path("/proc/stat").read_text().splitlines()
    return {
        name: [int(v) for v in rest[:8]]
        for name, *rest in (line.split() for line in lines)
        if name.startswith("cpu") and name[3:].isdigit()
    }


def core_use(before: dict[str, list[int]], after: dict[str, list[int]]) -> str:
    """Per core, over a run: the share busy and the share the hypervisor stole (steal: the
    core was ready to run but the host ran something else; a run whose steal moves moves
    with it, whatever the code does)."""
    parts = []
    for name, end in after.items():
        delta = [b - a for a, b in zip(before.get(name, end), end, strict=True)]
        total = sum(delta) or 1
        idle, iowait, steal = delta[3], delta[4], delta[7]
        busy = total - idle - iowait - steal
        parts.append(f"{name} busy {busy / total:.0%} steal {steal / total:.0%}")
    return ", ".join(parts)


def wrk(url: str, args, *, cpu: int | None, script: str | None = None, **env: str) -> dict:
    """One closed-loop wrk run; also the CPU seconds wrk used (user + system). Both servers
    get the same command: the same connections, the same headers (A2A-Version and a bearer
    token: the platform's API key, a dummy one of the same shape the SDK's server ignores)."""
    cmd = [*pinned(cpu), "wrk", "-t1", f"-c{args.connections}", f"-d{args.duration:.0f}s"]
    cmd += ["--latency", "--timeout", "60s", "-H", "A2A-Version: 1.0"]
    if "A2A_TOKEN" in env:
        cmd += ["-H", f"Authorization: Bearer {env['A2A_TOKEN']}"]
    cmd += ["-s", script] if script else []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [*cmd, url], capture_output=True, text=True, env={**os.environ, **env}, check=True
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50": wrk_ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1)),
        "p99": wrk_ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1)),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
        "errors": int(bad.group(1)) if bad else 0,
        "socket": sum(int(n) for n in sock.groups()) if sock else 0,
        "load_cpu": cpu_s / args.duration,
    }


def void(r: dict) -> str:
    """Why a run's figure cannot be compared ("" when it can): answers that were not 2xx
    (wrk counts non-2xx and 3xx together) or requests that failed on the socket."""
    parts = []
    if r.get("errors"):
        parts.append(f"{r['errors']} non-2xx")
    if r.get("socket"):
        parts.append(f"{r['socket']} socket errors")
    return ", ".join(parts)


def measure(
    name: str,
    url: str,
    args,
    side: Side,
    *,
    cpu: int | None,
    before_run: Callable[[], None] | None = None,
    **kw,
) -> dict:
    """A figure, staged the same on both servers: a --warmup run, the server settled (its
    backlog finished: side.settle), then the measured run."""
    kw = {**kw, "A2A_TOKEN": side.token}
    if args.warmup:
        warm = argparse.Namespace(**{**vars(args), "duration": args.warmup})
        run = {**kw, "A2A_RUN": f"w{time.time_ns()}"} if "script" in kw else kw
        wrk(url, warm, cpu=cpu, **run)
    if "script" in kw:
        kw = {**kw, "A2A_RUN": f"r{time.time_ns()}"}
    side.settle()
    roles = side.roles
    db = getattr(args, "pg_db", None) if "postgres" in roles else None
    if db:
        reset_statements(db)
    if before_run is not None:
        before_run()
    before, cores = cpu_by_role(roles), core_times()
    with profiling(name, args, roles):
        r = wrk(url, args, cpu=cpu, **kw)
    after, cores = cpu_by_role(roles), core_use(cores, core_times())
    if r["errors"] and "script" not in kw:
        sample = httpx.get(url, headers=side.headers, timeout=30)
        print(f"  ({name}: a sample refusal: {sample.status_code} {sample.text[:200]!r})")
    why = void(r)
    print(
        f"  {label(name):<50} {r['rps']:>8.0f} req/s  p50 {r['p50']:>7.1f} ms  p99 "
        f"{r['p99']:>7.1f} ms  {r['requests']:>7} requests, {r['errors']} non-2xx, "
        f"{r['socket']} socket errors; wrk CPU {r['load_cpu']:.0%}; load {load_average()}"
        + (f"  VOID ({why})" if why else ""),
        flush=True,
    )
    if roles and r["requests"]:
        per = {role: (after[role] - before[role]) * 1000 / r["requests"] for role in roles}
        total = sum(per.values())
        parts = ", ".join(f"{role} {ms:.2f}" for role, ms in per.items())
        print(f"    server CPU per request: {total:.2f} ms ({parts})", flush=True)
        print(f"    cores: {cores}", flush=True)
        r["cpu_ms"] = per
    if db and r["requests"]:
        statements_per_request(db, r["requests"])
    return r


def reset_statements(db: str) -> None:
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset(), pg_stat_reset()")


def pg_account(db: str, limit: int, width: int) -> tuple[list[tuple], tuple]:
    """Since the last reset: the statements that took PostgreSQL the most time (calls, total
    ms, the text's first `width` characters), and the database's sessions opened,
    transactions committed and rolled back."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), %s)"
            " FROM pg_stat_statements WHERE query NOT LIKE '%%pg_stat%%'"
            " ORDER BY total_exec_time DESC LIMIT %s",
            [width, limit],
        ).fetchall()
        totals = conn.execute(
            "SELECT sessions, xact_commit, xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
    return rows, totals


def statements_per_request(db: str, requests: int, limit: int = 6) -> None:
    """With --pg-stats, after each platform figure: the statements that took PostgreSQL the
    most time in that run alone, as calls and milliseconds per request, and its transactions
    per request."""
    rows, (_, commits, _) = pg_account(db, limit, 70)
    print(f"    PostgreSQL per request: {commits / requests:.2f} transactions; statements:")
    for calls, total, query in rows:
        print(f"      {calls / requests:>6.2f} calls {total / requests:>6.3f} ms  {query}")


@contextlib.contextmanager
def profiling(name: str, args, roles: dict[str, int]):
    """With --profile: py-spy on every role but PostgreSQL for the run inside (see the module
    docstring); prints the top functions by share of samples afterwards."""
    if not args.profile or not roles:
        yield
        return
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    spies = {}
    for role, pid in roles.items():
        if role in ("postgres", "beat"):
            continue
        path = out / f"{slug}-{role}.txt"
        cmd = [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--output",
            str(path),
        ]
        cmd += ["--rate", "250", "--nonblocking", "--gil", "--duration", f"{args.duration:.0f}"]
        cmd += ["--subprocesses"] if role.startswith("worker") else []
        spies[role] = (
            path,
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE),
        )
    try:
        yield
    finally:
        for role, (path, spy) in spies.items():
            _, err = spy.communicate(timeout=args.duration + 30)
            if spy.returncode or not path.exists():
                print(f"    (py-spy on {role} failed: {err.decode()[-300:].strip()})")
                continue
            print(f"    profile of {role} ({path}):")
            for share, frame in top_frames(path):
                print(f"      {share:>5.1%}  {frame}")


def top_frames(path: Path, limit: int = 16) -> list[tuple[float, str]]:
    """The project's functions on the most sampled stacks (inclusive), then the leaf functions
    where the samples land (self), idle threads left out. py-spy's raw format is one
    `frame;frame;... count` line per distinct stack, a frame `function (file:line)`."""
    inclusive: dict[str, int] = {}
    leaves: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")]
        for frame in set(frames):
            if frame.partition(" (")[2].startswith(PROJECT_PACKAGES):
                inclusive[frame] = inclusive.get(frame, 0) + n
        leaves[frames[-1]] = leaves.get(frames[-1], 0) + n
    if not total:
        return []
    ours = sorted(inclusive.items(), key=lambda kv: -kv[1])[:limit]
    own = sorted(leaves.items(), key=lambda kv: -kv[1])[: limit // 2]
    return [(n / total, f) for f, n in ours] + [(n / total, f"self: {f}") for f, n in own]


PROJECT_PACKAGES = ("a2a_platform/", "agents/", "tasks/", "webhooks/")


def _frame(frame: str) -> str:
    """`function (file:line)` -> `function (file)`: one row per function, not per line."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].removesuffix(')')})" if where else name


def seed_task(base: str, headers: dict[str, str]) -> str:
    body = {"message": {"messageId": f"seed-{time.time_ns()}", "role": "ROLE_USER"}}
    body["message"]["parts"] = [{"text": "seed"}]
    answer = httpx.post(f"{base}/message:send", headers=headers, json=body, timeout=30).json()
    if "task" not in answer:
        sys.exit(f"seeding failed: {answer}")
    return answer["task"]["id"]


class Side:
    """One server under test, as the staging sees it: its URL and headers, the processes
    whose CPU is counted, and how to tell that its backlog is finished."""

    name = ""
    base = ""
    token = ""
    roles: dict[str, int]

    @property
    def headers(self) -> dict[str, str]:
        return {"A2A-Version": "1.0", "Authorization": f"Bearer {self.token}"}

    def ready(self) -> None:
        raise NotImplementedError

    def settle(self, timeout: float = 600) -> float:
        """Until the tasks sent so far are finished; the monotonic time they were."""
        raise NotImplementedError

    def completed(self) -> int:
        raise NotImplementedError

    def after_history(self) -> str:
        """What the side does once the history is in (printed); "" for nothing."""
        return ""


class PlatformSide(Side):
    name = "platform"

    def __init__(self, base: str, token: str, db: str, roles: dict[str, int]) -> None:
        self.base, self.token, self.db, self.roles = base, token, db, roles

    def ready(self) -> None:
        wait_ready(self.base)  # /readyz: a worker's heartbeat proved the platform end to end

    def settle(self, timeout: float = 600) -> float:
        import psycopg

        deadline = time.monotonic() + timeout
        with psycopg.connect(self.db, autocommit=True) as conn:
            while time.monotonic() < deadline:
                left = conn.execute(
                    "SELECT count(*) FROM tasks_executordispatch "
                    "WHERE state IN ('pending','claimed')"
                ).fetchone()[0]
                if not left:
                    return time.monotonic()
                time.sleep(SETTLE_POLL)
        sys.exit(f"the platform's worker did not finish its backlog in {timeout:.0f} s")

    def completed(self) -> int:
        import psycopg

        with psycopg.connect(self.db, autocommit=True) as conn:
            return conn.execute(
                "SELECT count(*) FROM tasks_task WHERE state = 'TASK_STATE_COMPLETED'"
            ).fetchone()[0]

    def after_history(self) -> str:
        analyze(self.db)
        return "VACUUM ANALYZE (what autovacuum does to a database in use)"


class SdkSide(Side):
    def __init__(self, store: str, base: str, proc: subprocess.Popen, log: Path) -> None:
        self.name = f"SDK {store}"
        self.base, self.proc, self.log = base, proc, log
        # The shape of the platform's API keys (a2a_<prefix>_<secret>): the same header
        # bytes; the SDK's server ignores it.
        self.token = f"a2a_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
        self.roles = {"sdk": proc.pid}

    def ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/.well-known/agent-card.json").status_code == 200:
                    return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                sys.exit(f"the SDK server did not start: {self.log.read_text()}")
            time.sleep(0.2)

    def settle(self, timeout: float = 600) -> float:
        """The SDK's agent runs returnImmediately sends in background tasks: finished when its
        completed counter has not moved for three polls; the time it last moved."""
        deadline = time.monotonic() + timeout
        last, changed, still = self.completed(), time.monotonic(), 0
        while time.monotonic() < deadline:
            time.sleep(SETTLE_POLL)
            now = self.completed()
            if now != last:
                last, changed, still = now, time.monotonic(), 0
            else:
                still += 1
                if still >= 3:
                    return changed
        sys.exit(f"the SDK server did not finish its backlog in {timeout:.0f} s")

    def completed(self) -> int:
        """The SDK agent's completed-task counter, which it prints on SIGUSR1."""
        seen = self.log.read_text().count("completed ")
        self.proc.send_signal(signal.SIGUSR1)
        for _ in range(200):
            lines = re.findall(r"^completed (\d+)$", self.log.read_text(), re.M)
            if len(lines) > seen:
                return int(lines[-1])
            time.sleep(0.02)
        sys.exit("the SDK server did not report its completed tasks")


SETTLE_POLL = 0.1


def staged_figures(args, side: Side, load_cpu: int | None) -> dict[str, dict]:
    """The same staging on either server, then its figures: ready, --history seconds of
    returnImmediately sends (not measured), the backlog finished, then each figure as
    `measure` stages it (warm-up, settled, measured), the executor load last."""
    side.ready()
    done = history(args, side, load_cpu)
    side.settle()
    extra = side.after_history()
    print(
        f"  staging: ready; history {done}; settled{'; ' + extra if extra else ''}; each "
        f"figure: {args.warmup:.0f} s warm-up, settled, {args.duration:.0f} s measured; "
        f"{args.connections} connections; load average {load_average()}",
        flush=True,
    )
    task = seed_task(side.base, side.headers)
    figures: dict[str, dict] = {}
    figures["agent card"] = measure(
        "agent card", f"{side.base}/.well-known/agent-card.json", args, side, cpu=load_cpu
    )
    figures["GetTask"] = measure("GetTask", f"{side.base}/tasks/{task}", args, side, cpu=load_cpu)
    # Blocking first: returnImmediately leaves a backlog (settled before the next figure).
    for name, blocking in (
        ("SendMessage blocking (echo)", "1"),
        ("SendMessage returnImmediately", "0"),
    ):
        figures[name] = measure(
            name,
            f"{side.base}/message:send",
            args,
            side,
            cpu=load_cpu,
            script=SEND,
            A2A_BLOCKING=blocking,
        )
    # The executor's rate: a returnImmediately run whose tasks the server then completes,
    # counted from the measured run's start until its backlog is finished.
    mark: dict[str, float] = {}

    def start_count() -> None:
        mark["before"], mark["started"] = side.completed(), time.monotonic()

    load = measure(
        "SendMessage (load for the executor)",
        f"{side.base}/message:send",
        args,
        side,
        cpu=load_cpu,
        before_run=start_count,
        script=SEND,
        A2A_BLOCKING="0",
    )
    finished = side.settle()
    done_tasks = side.completed() - mark["before"]
    rate = done_tasks / max(finished - mark["started"], 1e-9)
    why = void(load)
    print(
        f"  {label('echo tasks completed /s'):<50} {rate:>8.0f} ({done_tasks} tasks, from the "
        f"run's start until the {side.name}'s backlog was finished); load {load_average()}"
        + (f"  VOID ({why})" if why else ""),
        flush=True,
    )
    figures["echo tasks completed /s"] = {**load, "rps": rate}
    return figures


def platform_run(args, server_cpu: int | None, load_cpu: int | None) -> dict[str, dict]:
    print("# the platform (PostgreSQL, durable)", flush=True)
    with own_postgres(server_cpu, statements=args.pg_stats) as (pg, postmaster):
        db = f"{pg}/{args.database}"
        if args.pg_stats:
            args.pg_db = db
        import psycopg

        with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{args.database}"')
        env = production_env(db)
        manage_as(env, server_cpu, "migrate", "-v0")
        if args.pg_stats:
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements")
        run_manage = functools.partial(manage_as, env, server_cpu)
        run_manage(*ECHO_AGENT)
        token = run_manage("create_api_key", "bench", "--name", "bench").splitlines()[-1]
        purge_broker()
        procs = Procs(prefix=pinned(server_cpu), env=env)
        port = free_port()
        try:
            procs.web(db, port, workers=args.web_workers)
            roles = {"web": procs.procs[-1].pid}
            for n in range(args.workers):
                roles[f"worker{n}"] = procs.celery_worker(
                    db,
                    f"cw{n}",
                    queues="agents,webhooks,heartbeat",
                    pool=args.worker_pool,
                    concurrency=args.worker_concurrency,
                ).pid
            roles["beat"] = procs.beat(db).pid
            roles["postgres"] = postmaster
            side = PlatformSide(f"http://127.0.0.1:{port}", token, db, roles)
            results = staged_figures(args, side, load_cpu)
            if args.pg_stats:
                top_statements(db)
        finally:
            procs.stop()
    return results


def manage_as(env: dict[str, str], cpu: int | None, *args: str) -> str:
    """manage.py in the environment the processes get (secrets are encrypted with its keys)."""
    cmd = [*pinned(cpu), sys.executable, "manage.py", *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def top_statements(db: str, limit: int = 15) -> None:
    """PostgreSQL's own account of the platform run: the statements that took the most time."""
    rows, (sessions, commits, rollbacks) = pg_account(db, limit, 100)
    print("  top statements of the executor load and its drain (calls, total ms, mean ms):")
    for calls, total, query in rows:
        print(f"    {calls:>8} {total:>9.1f} {total / calls:>7.3f}  {query}")
    print(
        f"  sessions opened {sessions}, transactions {commits} committed, {rollbacks} rolled back"
    )


def production_env(db: str) -> dict[str, str]:
    """The production profile, with a secret key and an encryption key made for this run."""
    from cryptography.fernet import Fernet

    return platform_env(
        db,
        A2A_PROFILE="production",
        SECRET_KEY=secrets.token_urlsafe(48),
        A2A_SECRETS_KEYS=Fernet.generate_key().decode(),
        ALLOWED_HOSTS="127.0.0.1,localhost",
        A2A_JOB_LOG_LEVEL="WARNING",
    )


def history(args, side: Side, load_cpu: int | None) -> str:
    """--history seconds of returnImmediately sends before the figures, not measured: the
    store the figures run against holds tasks, as a store in use does."""
    if args.history <= 0:
        return "none"
    run = argparse.Namespace(**{**vars(args), "duration": args.history})
    r = wrk(
        f"{side.base}/message:send",
        run,
        cpu=load_cpu,
        script=SEND,
        A2A_BLOCKING="0",
        A2A_RUN=f"h{time.time_ns()}",
        A2A_TOKEN=side.token,
    )
    return f"{r['requests']} tasks sent in {args.history:.0f} s (not measured)"


def analyze(db: str) -> None:
    """What autovacuum gathers on a database in use: its tables' statistics."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def sdk_run(args, store: str, server_cpu: int | None, load_cpu: int | None) -> dict[str, dict]:
    print(f"# the official SDK's server ({store} task store)", flush=True)
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="a2a-sdk-", suffix=".log")[1])
    sqlite = Path(tempfile.mkdtemp()) / "tasks.sqlite3"
    cmd = [*pinned(server_cpu), sys.executable, str(HERE / "sdk_server.py"), "--port", str(port)]
    cmd += ["--store", store, "--sqlite-path", str(sqlite)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        side = SdkSide(store, f"http://127.0.0.1:{port}", proc, log)
        return staged_figures(args, side, load_cpu)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="Celery worker processes")
    # The worker as the README runs it (-P threads -c 8).
    parser.add_argument("--worker-pool", default="threads", help="Celery pool (-P)")
    parser.add_argument("--worker-concurrency", type=int, default=8, help="Celery -c")
    parser.add_argument("--sdk-sqlite", action="store_true", help="also the SDK's SQLite store")
    parser.add_argument(
        "--no-pin", action="store_true", help="let every process use every core (scale-out)"
    )
    parser.add_argument("--no-sdk", action="store_true", help="the platform only")
    parser.add_argument(
        "--pg-stats",
        action="store_true",
        help="pg_stat_statements' top statements, per request of each figure",
    )
    parser.add_argument(
        "--history",
        type=float,
        default=10.0,
        help="seconds of sends before the figures, not measured (0: none)",
    )
    parser.add_argument("--profile", metavar="DIR", help="py-spy every server process (slower)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, the two servers' order alternating"
    )
    # The database inside the bench's own PostgreSQL server (initdb'd for each round).
    add_common_args(parser, "a2a_bench")
    args = parser.parse_args()
    if args.smoke:
        args.duration, args.warmup, args.history, args.rounds = 1.0, 0.0, 1.0, 1
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    if args.duration < 1 or 0 < args.warmup < 1:
        parser.error(
            "--duration and --warmup are whole seconds of wrk, 1 or more (--warmup 0: none)"
        )
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(
                f"{tool} is needed: apt-get install {'wrk' if tool == 'wrk' else 'util-linux'}"
            )
    if args.profile and not (Path(sys.executable).parent / "py-spy").exists():
        sys.exit("--profile needs py-spy in this venv: .venv/bin/pip install py-spy")
    two = (os.cpu_count() or 1) >= 2 and not args.no_pin
    server_cpu, load_cpu = (0, 1) if two else (None, None)
    print(
        f"# {os.cpu_count()} cores; server side on CPU {server_cpu}, wrk on CPU {load_cpu}; "
        f"{args.connections} connections, {args.duration:.0f} s per figure after "
        f"{args.warmup:.0f} s of warm-up; {args.rounds} round(s); load average "
        f"{load_average()}",
        flush=True,
    )
    print(
        f"#{QUICK_MARK}: a figure only the echo executor's quick path reaches on the platform "
        "(tasks/dispatch.py QUICK_EXECUTORS: one doorbell ring for the sends committed "
        "together, a drain job answering ten tasks a claim from the claim's rows); an agent "
        "with another executor takes one executor job per task. A figure whose run saw a "
        "non-2xx answer or a socket error is VOID: no ratio is drawn from it.",
        flush=True,
    )
    sides = ["platform"] if args.no_sdk else ["platform", "sdk"]
    rounds: list[dict[str, dict[str, dict]]] = []
    for n in range(args.rounds):
        print(f"# round {n + 1} of {args.rounds}", flush=True)
        runs = {
            "platform": lambda: platform_run(args, server_cpu, load_cpu),
            "sdk": lambda: sdk_run(args, "memory", server_cpu, load_cpu),
        }
        order = sides if n % 2 == 0 else sides[::-1]
        figures = {name: runs[name]() for name in order}
        if args.sdk_sqlite:
            sdk_run(args, "sqlite", server_cpu, load_cpu)
        if not args.no_sdk:
            print_ratios(figures["platform"], figures["sdk"])
        rounds.append(figures)
    print_spread(rounds, sides)
    print(f"# load average at the end {load_average()}")


def ratio_or_void(ours: dict, sdk: dict) -> tuple[float | None, str]:
    """The platform / SDK ratio of one figure, or None and why it is void."""
    why = [f"{side}: {void(r)}" for side, r in (("platform", ours), ("SDK", sdk)) if void(r)]
    if why:
        return None, "void: " + "; ".join(why)
    if not sdk["rps"]:
        return None, "void: the SDK's figure is 0"
    ratio = ours["rps"] / sdk["rps"]
    return ratio, f"{ratio:.2f}x"


def print_ratios(ours: dict[str, dict], sdk: dict[str, dict]) -> None:
    """This round's platform / SDK ratio of each target's figure (no verdict from one round)."""
    print("# this round: platform / SDK in-memory (target)")
    for name, target in TARGETS.items():
        _, text = ratio_or_void(ours[name], sdk[name])
        print(f"  {label(name):<50} {text:>8}  (target >= {target:.1f}x)", flush=True)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return (
        f"{min(values):,.0f} / {statistics.median(values):,.0f} / {max(values):,.0f}"
        if max(values) >= 10
        else f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"
    )


def over_rounds(valid: list[float], meets: list[bool], rounds: int, missed: str) -> tuple[str, str]:
    """A ratio over the rounds: min / median / max of its `valid` values (void rounds left
    out, and counted against `rounds`), and the verdict against its target from `meets`
    (each valid value's): only from two valid rounds or more, and only when every round
    agrees (`missed`: the word when none meets it)."""
    if len(valid) < 2:
        verdict = f"no verdict from {len(valid)} valid round(s)"
    elif all(meets):
        verdict = f"meets in all {len(valid)} valid rounds"
    elif not any(meets):
        verdict = f"{missed} in all {len(valid)} valid rounds"
    else:
        verdict = f"mixed over {len(valid)} valid rounds"
    ratio = (
        f"{min(valid):.2f}x / {statistics.median(valid):.2f}x / {max(valid):.2f}x" if valid else "-"
    )
    void_note = f", {rounds - len(valid)} of {rounds} void" if len(valid) < rounds else ""
    return ratio, verdict + void_note


def print_spread(rounds: list[dict[str, dict[str, dict]]], sides: list[str]) -> None:
    """Per figure over the rounds: each server's req/s and the ratio as min / median / max,
    void runs left out (and counted); a verdict only from two rounds or more, and only when
    every round agrees."""
    n = len(rounds)
    print(f"# spread over {n} round(s): min / median / max; void runs left out")
    for name in TARGETS:
        cells = []
        for side in sides:
            runs = [r[side][name] for r in rounds]
            ok = [x["rps"] for x in runs if not void(x)]
            voided = len(runs) - len(ok)
            cells.append(f"{side} {spread(ok)}" + (f" ({voided} of {n} void)" if voided else ""))
        line = f"  {label(name):<50} " + "   ".join(cells)
        if "sdk" in sides:
            ratios = [ratio_or_void(r["platform"][name], r["sdk"][name])[0] for r in rounds]
            valid = [x for x in ratios if x is not None]
            target = TARGETS[name]
            ratio, verdict = over_rounds(valid, [x >= target for x in valid], n, "below")
            line += f"   ratio {ratio} (target >= {target:.1f}x: {verdict})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
