"""The platform against the official a2a-sdk's own server, side by side in one run (figures only).

    .venv/bin/python bench/sdk_compare.py [--duration 15] [--warmup 3] [--connections 16]
                                          [--web-workers 1] [--workers 1] [--sdk-sqlite]
                                          [--worker-pool threads] [--worker-concurrency 8]
                                          [--pg-stats] [--no-pin] [--no-sdk]
                                          [--profile DIR] [--rounds 1] [--history 10]

Scale-out: `--web-workers 2 --workers 2 --no-pin --no-sdk` (two web processes and two
worker processes against one PostgreSQL and one Redis, every process on every core).

`--rounds N`: N rounds, each the platform's figures and the SDK's, in alternating order (the
platform first, then the SDK first, and so on), each round's ratios printed, then per figure
the median ratio and its range. A machine whose speed drifts during a run moves a single
round's ratios; alternating rounds cancel a steady drift, and the range shows how far to
trust the median.

Starts, one after the other on the same machine:
- the platform: a PostgreSQL server of the bench's own (initdb into a temporary directory,
  default durability: fsync and synchronous_commit on), uvicorn serving the ASGI app, a Celery
  worker on every queue (as the README runs it: -P threads -c 8) and beat, in the production
  profile (DEBUG off, caches on);
- the SDK: bench/sdk_server.py, its `DefaultRequestHandler` over `InMemoryTaskStore` (and,
  with --sdk-sqlite, over its SQLite `DatabaseTaskStore`), an echo agent in-process.

Before the figures, each server is sent --history seconds of returnImmediately sends, not
measured, so the figures run against a store in use, not an empty one. On the platform the
bench then waits for the worker to answer them and runs `VACUUM ANALYZE`, as autovacuum does
on a database in use: the statements each process prepares (its own and the foreign keys'
checks) are then planned for tables of their size. Without it (`--history 0`; the ANALYZE
still runs, on nearly empty tables) they are planned on nearly empty tables, whose plans (a
scan of the whole table) PostgreSQL keeps until autovacuum's next ANALYZE, a minute or more
into the run, while the tables grow by thousands of rows (docs/decisions.md, issue 19,
nineteenth pass).

On a machine with two cores or more the server side (all its processes, PostgreSQL included)
is pinned to CPU 0 and the load generator, `wrk` (Debian package), to CPU 1. Each figure is a
closed loop of --connections connections for --duration seconds after a --warmup run. The
platform's figures are durable: the task, its events and its outbox rows are committed before
the answer that depends on them. Printed: req/s, p50/p99, the load generator's CPU use (it
must not be the bottleneck), each core's busy and stolen share during the run (steal: time
the hypervisor gave to others while the core had work; runs whose steal differs are not
the same machine), and the platform/SDK ratio against the targets of issue 19.

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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from common import ECHO_AGENT, ROOT, Procs, free_port, platform_env, purge_broker  # noqa: E402
from protocol_bench import _ms, drain_queue, wait_ready  # noqa: E402

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
    """One closed-loop wrk run; also the CPU seconds wrk used (user + system)."""
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
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50": _ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1)),
        "p99": _ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1)),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
        "errors": int(bad.group(1)) if bad else 0,
        "load_cpu": cpu_s / args.duration,
    }


def measure(
    name: str, url: str, args, *, cpu: int | None, roles: dict[str, int] | None = None, **kw
) -> dict:
    warm = argparse.Namespace(**{**vars(args), "duration": args.warmup})
    wrk(url, warm, cpu=cpu, **{**kw, "A2A_RUN": f"w{time.time_ns()}"} if "script" in kw else kw)
    if "script" in kw:
        kw = {**kw, "A2A_RUN": f"r{time.time_ns()}"}
    db = getattr(args, "pg_db", None) if roles and "postgres" in roles else None
    if db:
        reset_statements(db)
    before, cores = cpu_by_role(roles or {}), core_times()
    with profiling(name, args, roles or {}):
        r = wrk(url, args, cpu=cpu, **kw)
    after, cores = cpu_by_role(roles or {}), core_use(cores, core_times())
    if r["errors"] and "script" not in kw:
        sample = httpx.get(url, headers={"A2A-Version": "1.0", **_auth(kw)}, timeout=30)
        print(f"  ({name}: a sample refusal: {sample.status_code} {sample.text[:200]!r})")
    print(
        f"  {name:<32} {r['rps']:>8.0f} req/s  p50 {r['p50']:>7.1f} ms  p99 {r['p99']:>7.1f} ms"
        f"  {r['requests']:>7} requests, {r['errors']} non-2xx; wrk CPU {r['load_cpu']:.0%}",
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


def completed_tasks(db: str) -> int:
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM tasks_task WHERE state = 'TASK_STATE_COMPLETED'"
        ).fetchone()[0]


def platform_run(args, server_cpu: int | None, load_cpu: int | None) -> dict[str, float]:
    print("# the platform (PostgreSQL, durable)", flush=True)
    results: dict[str, float] = {}
    with own_postgres(server_cpu, statements=args.pg_stats) as (pg, postmaster):
        db = f"{pg}/a2a_bench"
        if args.pg_stats:
            args.pg_db = db
        import psycopg

        with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE a2a_bench")
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
            base = f"http://127.0.0.1:{port}"
            wait_ready(base)
            auth = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
            history(args, base, load_cpu, token=token)
            drain_queue(db, timeout=600)
            analyze(db)
            results.update(common_figures(args, base, auth, load_cpu, roles, token=token))
            drain_queue(db)
            before = completed_tasks(db)
            started = time.monotonic()
            executor_load(args, base, load_cpu, roles, token=token)
            drain_queue(db, timeout=600)
            done = completed_tasks(db) - before
            rate = done / (time.monotonic() - started)
            print(f"  echo tasks completed /s          {rate:>8.0f} (the worker, {done} tasks)")
            results["echo tasks completed /s"] = rate
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


def common_figures(
    args, base: str, auth: dict, load_cpu: int | None, roles: dict[str, int], **kw
) -> dict[str, float]:
    task = seed_task(base, auth)
    figures = {}
    figures["agent card"] = measure(
        "agent card", f"{base}/.well-known/agent-card.json", args, cpu=load_cpu, roles=roles
    )["rps"]
    figures["GetTask"] = measure(
        "GetTask", f"{base}/tasks/{task}", args, cpu=load_cpu, roles=roles, **_token(kw)
    )["rps"]
    # Blocking first: returnImmediately leaves a backlog on the platform's worker.
    figures["SendMessage blocking (echo)"] = measure(
        "SendMessage blocking (echo)",
        f"{base}/message:send",
        args,
        cpu=load_cpu,
        roles=roles,
        script=SEND,
        A2A_BLOCKING="1",
        **_token(kw),
    )["rps"]
    figures["SendMessage returnImmediately"] = measure(
        "SendMessage returnImmediately",
        f"{base}/message:send",
        args,
        cpu=load_cpu,
        roles=roles,
        script=SEND,
        A2A_BLOCKING="0",
        **_token(kw),
    )["rps"]
    return figures


def history(args, base: str, load_cpu: int | None, **kw) -> None:
    """--history seconds of returnImmediately sends before the figures, not measured: the
    store the figures run against holds tasks, as a store in use does."""
    if args.history <= 0:
        return
    run = argparse.Namespace(**{**vars(args), "duration": args.history})
    r = wrk(
        f"{base}/message:send",
        run,
        cpu=load_cpu,
        script=SEND,
        A2A_BLOCKING="0",
        A2A_RUN=f"h{time.time_ns()}",
        **_token(kw),
    )
    print(f"  history: {r['requests']} tasks sent in {args.history:.0f} s (not measured)")


def analyze(db: str) -> None:
    """What autovacuum gathers on a database in use: its tables' statistics."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def executor_load(args, base: str, load_cpu: int | None, roles: dict[str, int], **kw) -> None:
    """A returnImmediately run whose tasks the executor then completes (counted by the caller)."""
    measure(
        "SendMessage (load for the executor)",
        f"{base}/message:send",
        args,
        cpu=load_cpu,
        roles=roles,
        script=SEND,
        A2A_BLOCKING="0",
        **_token(kw),
    )


def _auth(kw: dict) -> dict:
    return {"Authorization": f"Bearer {kw['A2A_TOKEN']}"} if "A2A_TOKEN" in kw else {}


def _token(kw: dict) -> dict:
    return {"A2A_TOKEN": kw["token"]} if kw.get("token") else {}


def sdk_run(args, store: str, server_cpu: int | None, load_cpu: int | None) -> dict[str, float]:
    print(f"# the official SDK's server ({store} task store)", flush=True)
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="a2a-sdk-", suffix=".log")[1])
    sqlite = Path(tempfile.mkdtemp()) / "tasks.sqlite3"
    cmd = [*pinned(server_cpu), sys.executable, str(HERE / "sdk_server.py"), "--port", str(port)]
    cmd += ["--store", store, "--sqlite-path", str(sqlite)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/.well-known/agent-card.json").status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit(f"the SDK server did not start: {log.read_text()}")
            time.sleep(0.2)
        roles = {"sdk": proc.pid}
        history(args, base, load_cpu)
        results = common_figures(args, base, {"A2A-Version": "1.0"}, load_cpu, roles)
        before = _sdk_completed(proc, log)
        started = time.monotonic()
        executor_load(args, base, load_cpu, roles)
        done = _sdk_completed(proc, log) - before
        rate = done / (time.monotonic() - started)
        print(f"  echo tasks completed /s          {rate:>8.0f} (in-process, {done} tasks)")
        results["echo tasks completed /s"] = rate
        return results
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _sdk_completed(proc: subprocess.Popen, log: Path) -> int:
    """The SDK agent's completed-task counter, which it prints on SIGUSR1."""
    seen = log.read_text().count("completed ")
    proc.send_signal(signal.SIGUSR1)
    for _ in range(100):
        lines = re.findall(r"^completed (\d+)$", log.read_text(), re.M)
        if len(lines) > seen:
            return int(lines[-1])
        time.sleep(0.05)
    sys.exit("the SDK server did not report its completed tasks")


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
        "--rounds", type=int, default=1, help="rounds, the two servers' order alternating"
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
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
        f"{args.warmup:.0f} s of warm-up; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    if args.no_sdk:
        for _ in range(args.rounds):
            platform_run(args, server_cpu, load_cpu)
        return
    rounds: list[dict[str, float]] = []
    for n in range(args.rounds):
        if args.rounds > 1:
            print(f"# round {n + 1} of {args.rounds}", flush=True)
        runs = {
            "platform": lambda: platform_run(args, server_cpu, load_cpu),
            "sdk": lambda: sdk_run(args, "memory", server_cpu, load_cpu),
        }
        order = ["platform", "sdk"] if n % 2 == 0 else ["sdk", "platform"]
        figures = {name: runs[name]() for name in order}
        if args.sdk_sqlite:
            sdk_run(args, "sqlite", server_cpu, load_cpu)
        rounds.append(print_ratios(figures["platform"], figures["sdk"]))
    if args.rounds > 1:
        print(f"# platform / SDK in-memory over {args.rounds} rounds: median (range)")
        for name, target in TARGETS.items():
            seen = sorted(r[name] for r in rounds)
            median = statistics.median(seen)
            verdict = "meets" if median >= target else "below"
            print(
                f"  {name:<32} {median:>6.2f}x  ({seen[0]:.2f}-{seen[-1]:.2f}; "
                f"target >= {target:.1f}x: {verdict})"
            )
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


def print_ratios(ours: dict[str, float], sdk: dict[str, float]) -> dict[str, float]:
    """Print and return the platform / SDK ratio of each target's figure."""
    print("# platform / SDK in-memory (target)")
    ratios = {}
    for name, target in TARGETS.items():
        ratio = ours[name] / sdk[name] if sdk[name] else float("inf")
        ratios[name] = ratio
        verdict = "meets" if ratio >= target else "below"
        print(f"  {name:<32} {ratio:>6.2f}x  (target >= {target:.1f}x: {verdict})", flush=True)
    return ratios


if __name__ == "__main__":
    main()
