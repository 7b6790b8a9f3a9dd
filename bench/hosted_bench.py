"""Hosted a2a-sdk executors: the platform against a2a-sdk's own server hosting the same class,
side by side in one run (figures only; issue 45's benchmark).

    .venv/bin/python bench/hosted_bench.py [--tasks 200] [--duration 15] [--warmup 3]
                                           [--connections 16] [--rounds 3]
                                           [--worker-pool threads] [--worker-concurrency 8]
                                           [--hosted-concurrency N] [--no-pin]
                                           [--database NAME] [--smoke]

The executors are bench/hosted_agents.py's, written only against a2a-sdk's public API. The
platform hosts them as `python:bench.hosted_agents:<attribute>` (its processes get the
project root on their PYTHONPATH, as docs/agents.md says); the SDK's server is a2a-sdk's
`DefaultRequestHandler` over its `InMemoryTaskStore` with the same class, imported from the same
name, served by uvicorn (uvloop, httptools) in a process of this script's own (`--serve-sdk`).

Two figures, each on both servers, the client the same for both: httpx over the HTTP+JSON
binding (`POST …/message:send`, `GET …/tasks/{id}`, bench/sdk_compare.py's routes), from this
process, with the headers sdk_compare sends (A2A-Version and a bearer token: the platform's
API key, a dummy one of the same shape the SDK's server ignores):

1. **time to all COMPLETED**: --tasks (200) tasks of `SleepAgentExecutor` (WORKING, awaits 1 s,
   one artifact, COMPLETED), sent at once, one connection each: the time from the first send
   until the last task was seen COMPLETED. Blocking sends, not returnImmediately and polling:
   a blocking answer comes when the server itself has the task terminal, so the figure has
   no polling interval in it and the servers no polling load beside the work. The platform's
   blocking SendMessage stops waiting after A2A_SEND_MESSAGE_MAX_WAIT_SECONDS (30 s) and
   answers the task as it stands; such a task is then read with GetTask every
   0.1 s until it is terminal (the SDK's server never needs it). Target: the platform's
   time at most 1.5x the SDK's.
2. **trivial tasks completed /s**: `TrivialAgentExecutor` (WORKING, one artifact, COMPLETED)
   driven by a closed loop of --connections (16) clients sending blocking SendMessage for
   --duration seconds after a --warmup run: the answers whose task is COMPLETED with its
   artifact, per second of the run (until the last answer). On the platform each answer is
   durable (the task, its events and its outbox rows are committed before the answer);
   on the SDK's server it is in memory. Target: the platform's rate at least 0.5x the SDK's.
   A blocking loop rather than sdk_compare's returnImmediately burst and backlog: every
   request is one completed task on both servers, and the client's cost per task is the
   same on both.

A figure whose run saw a failed request or a task that did not end COMPLETED with one
artifact is VOID, and its ratio is not drawn. Beside each figure: the client's CPU share (this
process: if it nears 100 % the client, not the server, set the figure) and the 1-minute load
average; for the second, the server side's CPU per completed task by process and each core's
busy and stolen share (sdk_compare's accounting).

Each round starts each server afresh (the platform: a PostgreSQL server of the bench's own,
initdb'd into a temporary directory with default durability, `--database` its database's
name; uvicorn serving the ASGI app; one Celery worker on every queue; beat; the production
profile, as bench/sdk_compare.py runs it), waits until it is ready (the platform: /readyz and
both hosted agents' cards answering 200, which they do only once the worker has loaded their
executors), runs a warm-up burst of --connections sleep tasks (not measured), then the two
figures. The servers' order alternates between rounds (the platform first, then the SDK first,
…); per figure, each server's value and the ratio as min / median / max over the rounds, and a
verdict against the target only from two valid rounds or more. `--rounds 1` (what --smoke
runs) prints no verdict.

The worker: `-P threads -c 8` by default, as the README runs it and an operator would for
hosted agents (--worker-pool, --worker-concurrency to change it; printed in the header);
A2A_HOSTED_CONCURRENCY is left at the platform's default unless --hosted-concurrency sets it.
On a machine with two cores or more, the server side (every platform process with its
PostgreSQL, or the SDK's server) is pinned to CPU 0 and this process, the client, to CPU 1
(`--no-pin`: every process on every core); Redis is the machine's (A2A_BENCH_BROKER_URL),
not pinned, as in sdk_compare. `--smoke`: one round, 20 sleep tasks, 1 s of the trivial
loop without warm-up (that the bench runs, not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import os
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from common import (  # noqa: E402
    ROOT,
    Procs,
    add_common_args,
    free_port,
    load_average,
    purge_broker,
)
from hosted_agents import SLEEP_SECONDS  # noqa: E402
from protocol_bench import wait_ready  # noqa: E402
from sdk_compare import (  # noqa: E402
    core_times,
    core_use,
    cpu_by_role,
    manage_as,
    over_rounds,
    own_postgres,
    pinned,
    production_env,
)

SLEEP = "python:bench.hosted_agents:SleepAgentExecutor"
TRIVIAL = "python:bench.hosted_agents:TrivialAgentExecutor"
AGENTS = {"sleep": SLEEP, "trivial": TRIVIAL}
COMPLETED = "TASK_STATE_COMPLETED"
TERMINAL = {
    COMPLETED,
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_AUTH_REQUIRED",
}
POLL_SECONDS = 0.1

TITLES = {
    "platform": "the platform (PostgreSQL, durable)",
    "sdk": "the official SDK's server (memory task store)",
}
ALL_DONE = "time to all COMPLETED"
RATE = "trivial tasks completed /s"
# Issue 45's targets: the platform's figure over the SDK in-memory server's, in the same run.
# (name, unit, the ratio's bound, whether the ratio must be at most the bound)
TARGETS = {ALL_DONE: ("s", 1.5, True), RATE: ("/s", 0.5, False)}


@dataclass(frozen=True)
class Server:
    """One hosted agent as the client sees it: its base URL and the headers it is sent."""

    base: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"A2A-Version": "1.0", "Authorization": f"Bearer {self.token}"}


@dataclass
class Side:
    """One server under test: its agents (by slug) and the processes whose CPU is counted."""

    name: str
    agents: dict[str, Server]
    roles: dict[str, int] = field(default_factory=dict)


# --- the client -------------------------------------------------------------------------------


async def send_blocking(client: httpx.AsyncClient, message_id: str) -> dict:
    """Blocking SendMessage; the task, read again with GetTask until it is terminal when the
    server answered before it was (the platform's A2A_SEND_MESSAGE_MAX_WAIT_SECONDS)."""
    body = {"message": {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": "go"}]}}
    resp = await client.post("/message:send", json=body)
    resp.raise_for_status()
    task = resp.json()["task"]
    while task["status"]["state"] not in TERMINAL:
        await asyncio.sleep(POLL_SECONDS)
        resp = await client.get(f"/tasks/{task['id']}")
        resp.raise_for_status()
        task = resp.json()
    return task


def done_right(task: dict) -> bool:
    return task["status"]["state"] == COMPLETED and len(task.get("artifacts", [])) == 1


class ClientCpu:
    """This process's CPU seconds over a block, as a share of its wall time."""

    def __enter__(self) -> ClientCpu:
        self.cpu, self.wall = self._cpu(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.share = (self._cpu() - self.cpu) / max(time.monotonic() - self.wall, 1e-9)

    @staticmethod
    def _cpu() -> float:
        use = resource.getrusage(resource.RUSAGE_SELF)
        return use.ru_utime + use.ru_stime


async def burst(server: Server, tasks: int, run: str) -> dict:
    """`tasks` blocking sends at once; when each task was seen terminal, from the first send."""
    limits = httpx.Limits(max_connections=tasks, max_keepalive_connections=tasks)
    async with httpx.AsyncClient(
        base_url=server.base, headers=server.headers, limits=limits, timeout=120
    ) as client:
        started = time.perf_counter()

        async def one(n: int) -> float | None:
            try:
                task = await send_blocking(client, f"{run}-{n}")
            except (httpx.HTTPError, KeyError, ValueError):
                return None
            return time.perf_counter() - started if done_right(task) else None

        times = await asyncio.gather(*(one(n) for n in range(tasks)))
    ok = sorted(t for t in times if t is not None)
    return {"value": ok[-1] if ok else 0.0, "times": ok, "failed": tasks - len(ok)}


async def closed_loop(server: Server, concurrency: int, duration: float, run: str) -> dict:
    """`concurrency` clients sending blocking SendMessage one after the other for `duration`
    seconds: the answers whose task is COMPLETED, per second until the last answer."""
    latencies: list[float] = []
    failed = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=server.base, headers=server.headers, limits=limits, timeout=120
    ) as client:
        stop_at = time.monotonic() + duration

        async def user(u: int) -> None:
            nonlocal failed
            n = 0
            while time.monotonic() < stop_at:
                n += 1
                sent = time.perf_counter()
                try:
                    ok = done_right(await send_blocking(client, f"{run}-{u}-{n}"))
                except (httpx.HTTPError, KeyError, ValueError):
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - sent)
                else:
                    failed += 1

        started = time.monotonic()
        await asyncio.gather(*(user(u) for u in range(concurrency)))
        elapsed = time.monotonic() - started
    latencies.sort()
    return {
        "value": len(latencies) / elapsed,
        "completed": len(latencies),
        "failed": failed,
        "elapsed": elapsed,
        "p50": statistics.median(latencies) * 1000 if latencies else 0.0,
        "p99": latencies[max(int(len(latencies) * 0.99) - 1, 0)] * 1000 if latencies else 0.0,
    }


# --- the figures ------------------------------------------------------------------------------


def void(r: dict) -> str:
    """Why a figure cannot be compared ("" when it can)."""
    if r["failed"]:
        return f"{r['failed']} failed or not COMPLETED with one artifact"
    return "" if r["value"] else "no task completed"


def figures(args, side: Side) -> dict[str, dict]:
    """The warm-up burst, then both figures on one server, printed as they come."""
    run = f"{side.name.split()[0]}-{time.time_ns()}"
    if args.warmup:
        warm = asyncio.run(burst(side.agents["sleep"], args.connections, f"w{run}"))
        if warm["failed"]:
            print(f"  (warm-up: {warm['failed']} of {args.connections} tasks failed)")
    results: dict[str, dict] = {}

    with ClientCpu() as cpu:
        r = asyncio.run(burst(side.agents["sleep"], args.tasks, f"s{run}"))
    times, why = r["times"], void(r)
    spread = f"first {times[0]:.2f} s, median {statistics.median(times):.2f} s" if times else "none"
    name = f"{ALL_DONE} ({args.tasks} x {SLEEP_SECONDS:g} s)"
    print(
        f"  {name:<40} {r['value']:>8.2f} s  (tasks completed: "
        f"{spread}; {r['failed']} failed); client CPU {cpu.share:.0%}; load {load_average()}"
        + (f"  VOID ({why})" if why else ""),
        flush=True,
    )
    results[ALL_DONE] = r

    if args.warmup:
        asyncio.run(closed_loop(side.agents["trivial"], args.connections, args.warmup, f"u{run}"))
    before, cores = cpu_by_role(side.roles), core_times()
    with ClientCpu() as cpu:
        r = asyncio.run(
            closed_loop(side.agents["trivial"], args.connections, args.duration, f"t{run}")
        )
    after, cores = cpu_by_role(side.roles), core_use(cores, core_times())
    why = void(r)
    print(
        f"  {RATE:<40} {r['value']:>8.0f} /s  ({r['completed']} tasks in {r['elapsed']:.1f} s, "
        f"c={args.connections}, p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, "
        f"{r['failed']} failed); client CPU {cpu.share:.0%}; load {load_average()}"
        + (f"  VOID ({why})" if why else ""),
        flush=True,
    )
    if r["completed"]:
        per = {role: (after[role] - before[role]) * 1000 / r["completed"] for role in after}
        parts = ", ".join(f"{role} {ms:.2f}" for role, ms in per.items())
        print(f"    server CPU per task: {sum(per.values()):.2f} ms ({parts})", flush=True)
        print(f"    cores: {cores}", flush=True)
    results[RATE] = r
    return results


# --- the platform -----------------------------------------------------------------------------


@contextlib.contextmanager
def platform(args, server_cpu: int | None) -> Iterator[Side]:
    """The platform in the production profile on a PostgreSQL server of its own, both agents
    created and their cards served (their executors loaded by the worker)."""
    import psycopg

    with own_postgres(server_cpu) as (pg, postmaster):
        db = f"{pg}/{args.database}"
        with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{args.database}"')
        env = production_env(db)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if args.hosted_concurrency is not None:
            env["A2A_HOSTED_CONCURRENCY"] = str(args.hosted_concurrency)
        manage_as(env, server_cpu, "migrate", "-v0")
        tokens = {}
        for slug, spec in AGENTS.items():
            manage_as(
                env,
                server_cpu,
                "create_agent",
                slug,
                "--name",
                slug.title(),
                "--description",
                f"bench: {spec}",
                "--executor",
                spec,
            )
            key = manage_as(env, server_cpu, "create_api_key", slug, "--name", "bench")
            tokens[slug] = key.splitlines()[-1]
        purge_broker()
        procs = Procs(prefix=pinned(server_cpu), env=env)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        try:
            procs.web(db, port)
            roles = {"web": procs.procs[-1].pid}
            roles["worker"] = procs.celery_worker(
                db,
                "hosted-bench-worker",
                queues="agents,webhooks,heartbeat",
                pool=args.worker_pool,
                concurrency=args.worker_concurrency,
            ).pid
            roles["beat"] = procs.beat(db, name="hosted-bench-beat").pid
            roles["postgres"] = postmaster
            wait_ready(base)
            agents = {slug: Server(f"{base}/{slug}", tokens[slug]) for slug in AGENTS}
            for slug, server in agents.items():
                wait_card(server, f"the platform's {slug} agent")
            yield Side("platform", agents, roles)
        finally:
            procs.stop()


def wait_card(server: Server, what: str, timeout: float = 60) -> None:
    """Until the agent's card answers 200 (the platform's: once a worker loaded its executor)."""
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            resp = httpx.get(f"{server.base}/.well-known/agent-card.json", timeout=5)
            status = resp.status_code
            if status == 200:
                return
        time.sleep(0.2)
    sys.exit(f"{what}'s card did not answer 200 in {timeout:.0f} s (last: {status})")


# --- a2a-sdk's own server ---------------------------------------------------------------------


@contextlib.contextmanager
def sdk(server_cpu: int | None) -> Iterator[Side]:
    """One SDK server process per agent, each `DefaultRequestHandler` + `InMemoryTaskStore`
    hosting the agent's executor class (the SDK hosts one executor per handler)."""
    procs: dict[str, subprocess.Popen] = {}
    agents: dict[str, Server] = {}
    logs: dict[str, Path] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The shape of the platform's API keys (a2a_<prefix>_<secret>): the same header bytes.
    token = f"a2a_{secrets.token_hex(4)}_{secrets.token_urlsafe(32)}"
    try:
        for slug, spec in AGENTS.items():
            port = free_port()
            logs[slug] = Path(tempfile.mkstemp(prefix=f"a2a-sdk-{slug}-", suffix=".log")[1])
            cmd = [*pinned(server_cpu), sys.executable, __file__, "--serve-sdk", spec]
            cmd += ["--port", str(port)]
            with open(logs[slug], "wb") as out:
                procs[slug] = subprocess.Popen(
                    cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
                )
            agents[slug] = Server(f"http://127.0.0.1:{port}", token)
        for slug, server in agents.items():
            if procs[slug].poll() is not None:
                sys.exit(f"the SDK server for {slug} exited: {logs[slug].read_text()[-2000:]}")
            wait_card(server, f"the SDK's {slug} server")
        yield Side("SDK in-memory", agents, {f"sdk-{slug}": p.pid for slug, p in procs.items()})
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs.values():
            log.unlink(missing_ok=True)


def load_executor(spec: str):
    """The executor `python:<module>:<attribute>` names, as the platform reads the name: a class
    constructed with no arguments, or a zero-argument callable returning an instance."""
    _, module, attribute = spec.split(":")
    return getattr(importlib.import_module(module), attribute)()


def serve_sdk(spec: str, port: int) -> None:
    """a2a-sdk's server for one executor: `DefaultRequestHandler` over `InMemoryTaskStore`,
    the HTTP+JSON and JSON-RPC routes and the card, bench/sdk_server.py's as for its echo."""
    import uvicorn
    from a2a.server.tasks import InMemoryTaskStore
    from a2a.types import AgentSkill
    from sdk_server import app, card

    agent_card = card(
        f"http://127.0.0.1:{port}",
        name=spec.rpartition(":")[2],
        description=f"a2a-sdk's own server hosting {spec} (bench baseline)",
        skill=AgentSkill(id="bench", name="bench", description="bench", tags=["bench"]),
    )
    uvicorn.run(
        app(agent_card, load_executor(spec), InMemoryTaskStore()),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


# --- ratios and spread ------------------------------------------------------------------------


def ratio_or_void(ours: dict, theirs: dict) -> tuple[float | None, str]:
    """The platform / SDK ratio of one figure, or None and why it is void."""
    why = [f"{side}: {void(r)}" for side, r in (("platform", ours), ("SDK", theirs)) if void(r)]
    if why:
        return None, "void: " + "; ".join(why)
    ratio = ours["value"] / theirs["value"]
    return ratio, f"{ratio:.2f}x"


def target_text(name: str) -> str:
    _, bound, at_most = TARGETS[name]
    return f"target {'<=' if at_most else '>='} {bound:.1f}x"


def print_ratios(round_: dict[str, dict[str, dict]]) -> None:
    print("# this round: platform / SDK in-memory (target)")
    for name in TARGETS:
        _, text = ratio_or_void(round_["platform"][name], round_["sdk"][name])
        print(f"  {name:<40} {text:>8}  ({target_text(name)})", flush=True)


def spread(values: list[float], unit: str) -> str:
    if not values:
        return "-"
    fmt = "{:,.0f}" if unit == "/s" else "{:.2f}"
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{fmt.format(low)} / {fmt.format(mid)} / {fmt.format(high)} {unit}"


def print_spread(rounds: list[dict[str, dict[str, dict]]]) -> None:
    """Per figure over the rounds: each server's value and the ratio as min / median / max,
    void runs left out (and counted); a verdict only from two valid rounds or more, and only
    when every round agrees."""
    n = len(rounds)
    print(f"# spread over {n} round(s): min / median / max; void runs left out")
    for name, (unit, bound, at_most) in TARGETS.items():
        cells = []
        for side in ("platform", "sdk"):
            runs = [r[side][name] for r in rounds]
            ok = [x["value"] for x in runs if not void(x)]
            voided = len(runs) - len(ok)
            cells.append(
                f"{side} {spread(ok, unit)}" + (f" ({voided} of {n} void)" if voided else "")
            )
        ratios = [ratio_or_void(r["platform"][name], r["sdk"][name])[0] for r in rounds]
        valid = [x for x in ratios if x is not None]
        meets = [x <= bound if at_most else x >= bound for x in valid]
        ratio, verdict = over_rounds(valid, meets, n, "misses")
        print(
            f"  {name:<40} {'   '.join(cells)}   ratio {ratio} ({target_text(name)}: {verdict})",
            flush=True,
        )


# --- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=200, help="sleep tasks sent at once")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of the loop")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds (0: no warm-up)")
    parser.add_argument("--connections", type=int, default=16, help="the loop's clients")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, the two servers' order alternating"
    )
    # The worker as the README runs it, and as an operator runs one for hosted agents.
    parser.add_argument("--worker-pool", default="threads", help="Celery pool (-P)")
    parser.add_argument("--worker-concurrency", type=int, default=8, help="Celery -c")
    parser.add_argument(
        "--hosted-concurrency",
        type=int,
        default=None,
        help="A2A_HOSTED_CONCURRENCY for the worker (default: the platform's own default)",
    )
    parser.add_argument("--no-pin", action="store_true", help="let every process use every core")
    parser.add_argument("--serve-sdk", metavar="SPEC", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    # The database inside the bench's own PostgreSQL server (initdb'd for each round).
    add_common_args(parser, "a2a_bench_hosted")
    args = parser.parse_args()
    if args.serve_sdk:
        serve_sdk(args.serve_sdk, args.port)
        return
    if args.smoke:
        args.tasks, args.duration, args.warmup, args.rounds = 20, 1.0, 0.0, 1
    if args.rounds < 1 or args.tasks < 1 or args.duration <= 0:
        parser.error("--rounds, --tasks and --duration must be positive")

    two = (os.cpu_count() or 1) >= 2 and not args.no_pin
    server_cpu, client_cpu = (0, 1) if two else (None, None)
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})
    hosted = (
        f"A2A_HOSTED_CONCURRENCY={args.hosted_concurrency}"
        if args.hosted_concurrency is not None
        else "A2A_HOSTED_CONCURRENCY at its default"
    )
    print(
        f"# {os.cpu_count()} cores; server side on CPU {server_cpu}, the client on CPU "
        f"{client_cpu}; the platform's worker -P {args.worker_pool} -c "
        f"{args.worker_concurrency}, {hosted}; {args.tasks} sleep tasks; the trivial loop "
        f"c={args.connections} for {args.duration:.0f} s after {args.warmup:.0f} s of warm-up; "
        f"{args.rounds} round(s); load average {load_average()}",
        flush=True,
    )
    print(
        "# the same executor classes on both (bench/hosted_agents.py); the same client "
        "(httpx, HTTP+JSON, blocking SendMessage); the platform's answers durable, the SDK's "
        "in memory. A figure with a failed task is VOID: no ratio is drawn from it.",
        flush=True,
    )
    runs = {
        "platform": lambda: platform(args, server_cpu),
        "sdk": lambda: sdk(server_cpu),
    }
    rounds: list[dict[str, dict[str, dict]]] = []
    for n in range(args.rounds):
        print(f"# round {n + 1} of {args.rounds}", flush=True)
        order = ["platform", "sdk"] if n % 2 == 0 else ["sdk", "platform"]
        round_: dict[str, dict[str, dict]] = {}
        for name in order:
            with runs[name]() as side:
                print(f"# {TITLES[name]}", flush=True)
                round_[name] = figures(args, side)
        print_ratios(round_)
        rounds.append(round_)
    print_spread(rounds)
    print(f"# load average at the end {load_average()}")


if __name__ == "__main__":
    main()
