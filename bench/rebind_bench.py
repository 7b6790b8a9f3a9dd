"""Rebind drain time and the cost an open rebind adds to a transition (figures, never
assertions).

    .venv/bin/python bench/rebind_bench.py [--tasks 10000] [--rounds 2] [--workers 1]
        [--cost-tasks 300 --cost-seconds 4 --cost-rounds 3] [--mark-setup] [--profile]
        [--database NAME] [--smoke]

What runs, all on this machine (every process gets DATABASE_URL=.../<--database, default
a2a_rbench>, CELERY_BROKER_URL=--broker (default A2A_BENCH_BROKER_URL, else
redis://127.0.0.1:6379/12) and A2A_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,::1/128):

- a fresh PostgreSQL database (common.fresh_database, migrated);
- the sink of the delivery bench (bench/sink.py: uvloop + httptools, answers 200);
- Celery workers consuming `webhooks` (`-P threads -c 16` by default), started once and kept
  for every drain round; no beat (the bench itself advances the rebind, and runs the
  delivery sweep every A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS, as beat would).

1. Drain, --rounds times, each on fresh data: a new external-executor agent, --tasks tasks
   (task_send, push_config_create at http://127.0.0.1:<sink>/hooks/v1/task-<i>,
   task_transition to WORKING). What they owe (a snapshot and a status update each) is
   delivered first by the workers ("setup deliveries", their rate is printed as a baseline),
   or with --mark-setup marked delivered in SQL. Then, timed from the call of
   rebind_start(RebindRequest(agent, move_from=.../hooks/v1/, move_to=.../hooks/v2/,
   policy=drain), actor="bench") (no key rotation): "plan" is until rebind_start returns
   (it runs rebind_advance, which plans every batch of A2A_REBIND_BATCH moves, each its own
   transaction: the rebind is draining with moves_planned on return); then the bench calls
   rebind_advance every --poll seconds (what beat's rebind_monitor does every
   A2A_REBIND_MONITOR_INTERVAL_SECONDS) until the rebind is completed: "complete".
   From the rows: notices delivered/s (delivered notices / (last notice finished_at - start)),
   notice latency p50/p99 (Delivery.created_at -> finished_at: planning writes the notices
   in batches, so this includes queueing behind the rest of the drain), "last notice" (s from
   the start to the last notice's finished_at) and how long completion took after it.
   Where the time went is read from outside the services, never by wrapping them: the public
   calls this bench makes are timed around them (rebind_start once; rebind_advance, count,
   total and slowest; the delivery sweep), and the rows say the rest: "moves planned" is
   from the start to the last ChannelMove row's created_at (planning writes the moves batch
   by batch), "moves done" to the last one's finished_at.
2. Transition cost, the same run, no webhooks worker running: three more agents with
   --cost-tasks tasks each (one push config each, setup deliveries marked delivered):
     A   no rebind;
     B1  an open drain with finish_on_old=True: the configs stay on their binding, so a
         transition writes a pending delivery, as without a rebind (same path plus the
         open rebind's rows in the database);
     B2  an open drain whose notices are not delivered (no worker runs): each config's old
         binding is retired and the new one waits for its notice, so a transition writes a
         held delivery for the new binding (the held path).
   Rounds of --cost-seconds interleave A/B1/B2, --cost-rounds times; each is --cost-threads
   threads of this process calling tasks.services.task_transition WORKING <-> INPUT_REQUIRED
   on disjoint tasks. Printed: events/s per round, medians, and the ratios B/A.

--profile: also pg_stat_activity sampled during each drain (what the bench database's active
backends wait on, in which statement), the statements rebind_start and the rebind_advance
calls ran (Django's execute_wrapper on this process's connection: count and time per
statement shape), and EXPLAIN (ANALYZE, BUFFERS) of the slowest SELECTs rebind_advance ran,
with their captured parameters, in a transaction rolled back.

Public entry points only: rebind_start / rebind_advance (webhooks.rebinds.operations, with
RebindRequest from webhooks.rebinds.checks, as the CLI and the API call them),
services.task_send / task_transition / push_config_create / delivery_sweep,
agents.services.agent_create. `--smoke`: 20 tasks, one round, the setup deliveries
delivered by one worker, the cost sets of 8 tasks for one round of 0.5 s (that the bench
runs, not a figure). Each drain round's line ends with the 1-minute load average.

Process logs are in var/bench/ (rebind-*.log).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import delivery_bench  # noqa: E402
from common import (  # noqa: E402
    BIN,
    ROOT,
    Procs,
    add_common_args,
    fresh_database,
    load_average,
    platform_env,
)
from delivery_bench import CpuMeter, PgWaits, Sink, pg_setting, run_threads  # noqa: E402

DB_NAME = "a2a_rbench"
DEFAULT_BROKER = "redis://127.0.0.1:6379/12"
ALLOWED = {"A2A_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128"}
LOG_DIR = ROOT / "var" / "bench"
TOKEN = "bench-token"
WORKING = "TASK_STATE_WORKING"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"


# --- timing the bench's own calls ------------------------------------------------------------


class Timers:
    """Wall time and calls per public call this bench makes (thread-safe): `call` times one
    call made here; nothing of the platform is wrapped or replaced."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[str, list[float]] = {}  # name -> [calls, seconds, slowest]

    def call(self, name: str, fn: Callable, *args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - started
            with self.lock:
                entry = self.data.setdefault(name, [0, 0.0, 0.0])
                entry[0] += 1
                entry[1] += spent
                entry[2] = max(entry[2], spent)

    def snapshot(self) -> dict[str, list[float]]:
        with self.lock:
            return {k: list(v) for k, v in self.data.items()}

    def reset(self) -> None:
        with self.lock:
            self.data.clear()


class QueryLog:
    """Statements run on this thread's connection (Django's execute_wrapper, a public hook):
    count and wall time per statement shape (its first 72 characters), and the first SQL and
    parameters of each shape (for EXPLAIN)."""

    def __init__(self) -> None:
        self.data: dict[str, list[float]] = {}
        self.samples: dict[str, tuple[str, object]] = {}

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            key = " ".join(sql.split())[:72]
            entry = self.data.setdefault(key, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - started
            if not many:
                self.samples.setdefault(key, (sql, params))

    def top(self, n: int = 14) -> list[tuple[str, int, float]]:
        rows = sorted(self.data.items(), key=lambda kv: -kv[1][1])[:n]
        return [(k, int(c), s) for k, (c, s) in rows]

    def total(self) -> tuple[int, float]:
        return sum(int(c) for c, _ in self.data.values()), sum(s for _, s in self.data.values())


# --- workers ---------------------------------------------------------------------------------


class Workers:
    """Webhooks workers, kept across the drain rounds."""

    def __init__(self, db: str, args) -> None:
        self.procs = Procs()
        self.names = [f"rebind-w{i}" for i in range(args.workers)]
        self.list = []
        for name in self.names:
            cmd = [str(BIN / "celery"), "-A", "a2a_platform", "worker", "-Q", "webhooks"]
            cmd += ["-n", f"{name}@%h", "-P", args.pool, "-c", str(args.concurrency)]
            cmd += ["--without-gossip", "--without-mingle", "-l", "INFO"]
            self.list.append(self.procs.start(cmd, platform_env(db, **ALLOWED), name=name))
        for proc, name in zip(self.list, self.names, strict=True):
            self.procs.wait_ready(proc, name)

    def pids(self) -> list[int]:
        return [pid for proc in self.list for pid in delivery_bench.pgroup(proc.pid)]

    def stop(self) -> None:
        self.procs.stop()


# --- setup -----------------------------------------------------------------------------------


def new_agent(slug: str):
    from agents.services import agent_create

    return agent_create(slug=slug, name=slug, description="rebind bench", executor="external")


def _setup_child(agent_pk: int, indices: list[int], base_url: str, threads: int, out) -> None:
    """A setup process (multiprocessing spawn): make the tasks of `indices`."""
    import django

    django.setup()
    from agents.models import Agent

    out.put(_make(Agent.objects.get(pk=agent_pk), indices, base_url, threads))


def make_tasks(agent, count: int, base_url: str, threads: int, procs: int = 1) -> list[str]:
    """`count` WORKING tasks with one push config each at <base_url>/hooks/v1/task-<i>, made
    through the services by `procs` spawned processes of `threads` threads."""
    if procs <= 1:
        return _make(agent, list(range(count)), base_url, threads)
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    children = [
        ctx.Process(
            target=_setup_child,
            args=(agent.pk, list(range(k, count, procs)), base_url, threads, out),
            daemon=True,
        )
        for k in range(procs)
    ]
    for child in children:
        child.start()
    ids = [task for _ in children for task in out.get(timeout=3600)]
    for child in children:
        child.join(timeout=30)
    if len(ids) != count:
        raise RuntimeError(f"setup made {len(ids)} of {count} tasks")
    return ids


def _make(agent, indices: list[int], base_url: str, threads: int) -> list[str]:
    from tasks.services import task_send, task_transition
    from webhooks.services import push_config_create

    ids: list[str] = []
    todo = iter(indices)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            msg = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "go"}]}
            task = task_send(agent=agent, owner="bench", message=msg).task
            config = {"url": f"{base_url}/hooks/v1/task-{i}", "id": "sink", "token": TOKEN}
            # The issuer the protocol stores (the agent's URL): a notice names the JWKS beside it.
            push_config_create(task=task, config=config, issuer=f"http://127.0.0.1/{agent.slug}")
            task_transition(task_id=task.pk, to_state=WORKING)
            with lock:
                ids.append(str(task.pk))

    run_threads(work, threads)
    return ids


def _tables() -> dict[str, str]:
    from tasks.models import Task
    from webhooks.models import Delivery, PushConfig

    return {
        "task": Task._meta.db_table,
        "delivery": Delivery._meta.db_table,
        "config": PushConfig._meta.db_table,
    }


def open_count(db: str, agent_pk: int) -> int:
    import psycopg

    t = _tables()
    with psycopg.connect(db, autocommit=True) as conn:
        return conn.execute(
            f"SELECT count(*) FROM {t['delivery']} d JOIN {t['task']} t ON t.id = d.task_id "
            "WHERE t.agent_id = %s AND d.state IN ('pending', 'sending')",
            [agent_pk],
        ).fetchone()[0]


def mark_delivered(db: str, agent_pk: int) -> int:
    """Setup shortcut: what this agent's tasks owe is marked delivered; heads cleared."""
    import psycopg

    t = _tables()
    with psycopg.connect(db, autocommit=True) as conn:
        n = conn.execute(
            f"UPDATE {t['delivery']} d SET state = 'delivered', finished_at = now() "
            f"FROM {t['task']} t WHERE t.id = d.task_id AND t.agent_id = %s "
            "AND d.state IN ('pending', 'sending')",
            [agent_pk],
        ).rowcount
        conn.execute(
            f"UPDATE {t['config']} p SET head_due_at = NULL FROM {t['task']} t "
            "WHERE t.id = p.task_id AND t.agent_id = %s",
            [agent_pk],
        )
    return n


def vacuum(db: str) -> None:
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def deliver_setup(db: str, agent_pk: int, stall: float) -> tuple[int, float]:
    """Wait until the workers delivered what the agent's tasks owe: (deliveries, seconds from
    the first created to the last finished)."""
    from django.db.models import Max, Min

    from webhooks.models import Delivery

    last, last_change = -1, time.monotonic()
    sweeper = Sweeper()
    while (left := open_count(db, agent_pk)) > 0:
        sweeper.maybe()
        if left != last:
            last, last_change = left, time.monotonic()
        elif time.monotonic() - last_change > stall:
            raise RuntimeError(f"setup deliveries stalled with {left} open")
        time.sleep(0.2)
    span = Delivery.objects.filter(task__agent_id=agent_pk).aggregate(
        n=Min("created_at"), x=Max("finished_at")
    )
    n = Delivery.objects.filter(task__agent_id=agent_pk, state="delivered").count()
    return n, (span["x"] - span["n"]).total_seconds()


class Sweeper:
    """What beat's delivery sweeper does (a lease that expired, a lost ring), run from the
    bench process every A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS: without it a retried head whose
    ring was lost stalls (no beat runs here, so the rebind monitor stays out of the figures)."""

    def __init__(self) -> None:
        from django.conf import settings

        self.every = settings.A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS
        self.next = time.monotonic() + self.every

    def maybe(self, timers: Timers | None = None) -> None:
        from webhooks.services import delivery_sweep

        if time.monotonic() >= self.next:
            if timers is None:
                delivery_sweep()
            else:
                timers.call("delivery_sweep", delivery_sweep)
            self.next = time.monotonic() + self.every


# --- 1. drain --------------------------------------------------------------------------------


@dataclass
class Drain:
    tasks: int
    setup: str
    plan_s: float
    planned: bool
    complete_s: float
    state: str
    notices: int
    delivered: int
    retried: int
    last_notice_s: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    sink_unique: int
    advances: int
    moves: int
    moves_planned_s: float  # start -> the last ChannelMove row's created_at
    moves_done_s: float  # start -> the last ChannelMove row's finished_at
    timers: dict[str, list[float]]
    cpu: dict[str, float]
    load: str = field(default_factory=load_average)
    pg: dict | None = None
    queries: QueryLog | None = None
    advance_queries: QueryLog | None = None
    explain: list[str] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.delivered / self.last_notice_s if self.last_notice_s > 0 else float("nan")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * q))]


def explain_slowest(queries: QueryLog, limit: int = 3) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the slowest SELECT shapes a QueryLog saw, each with the
    SQL and parameters it captured, in a transaction that is rolled back."""
    from django.db import connection, transaction

    out: list[str] = []
    shown = 0
    for key, _, _ in queries.top(len(queries.data)):
        sql, params = queries.samples.get(key, ("", None))
        if not sql.lstrip().upper().startswith(("SELECT", "WITH")) or shown >= limit:
            continue
        shown += 1
        try:
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
                    plan = [r[0] for r in cur.fetchall()]
                transaction.set_rollback(True)
        except Exception as exc:  # a statement EXPLAIN cannot take: say so, go on
            plan = [f"(not explained: {type(exc).__name__}: {exc})"]
        out.append(f"{key}:")
        out += [f"    {line}" for line in plan]
    return out


def drain_round(n: int, ctx: dict) -> Drain:
    from django.db import connection

    from webhooks.models import ChannelMove, Delivery, RebindState
    from webhooks.rebinds import operations as rebinds
    from webhooks.rebinds.checks import RebindRequest

    args, db, sink, workers, timers = (ctx[k] for k in ("args", "db", "sink", "workers", "timers"))
    agent = new_agent(f"rb-drain-{n}")
    started = time.monotonic()
    make_tasks(agent, args.tasks, sink.base, args.setup_threads, args.setup_procs)
    made = time.monotonic() - started
    if args.mark_setup:
        marked = mark_delivered(db, agent.pk)
        setup = (
            f"{args.tasks} tasks in {made:.0f} s; {marked} setup deliveries marked delivered in "
            "SQL (the workers, running, delivered the others while the setup wrote them)"
        )
    else:
        delivered, span = deliver_setup(db, agent.pk, args.stall)
        setup = (
            f"{args.tasks} tasks in {made:.0f} s; {delivered} setup deliveries delivered by the "
            f"workers at {delivered / span:,.0f}/s (first created -> last finished, while the "
            "setup was still writing)"
        )
    vacuum(db)
    time.sleep(args.settle)  # the pumps finished lingering
    sink.reset()
    timers.reset()
    waits = PgWaits(db).start() if args.profile else None
    meter = CpuMeter(workers.pids).start()

    t0_wall = time.time()
    t0 = time.perf_counter()
    req = RebindRequest(
        agent=agent,
        move_from=f"{sink.base}/hooks/v1/",
        move_to=f"{sink.base}/hooks/v2/",
        policy="drain",
        deadline_seconds=3600,
        reason="rebind bench",
    )
    queries = QueryLog() if args.profile else None
    advance_queries = QueryLog() if args.profile else None
    if queries is not None:
        with connection.execute_wrapper(queries):
            rebind = timers.call("rebind_start", rebinds.rebind_start, req, actor="bench")
    else:
        rebind = timers.call("rebind_start", rebinds.rebind_start, req, actor="bench")
    plan_s = time.perf_counter() - t0
    # Planned on return: draining with every move planned, or already completed (on a quiet
    # machine the workers can deliver every notice before rebind_start's last advance).
    planned = rebind.moves_planned and rebind.state in (
        RebindState.DRAINING,
        RebindState.COMPLETED,
    )
    advances = 0
    sweeper = Sweeper()
    while rebind.state == RebindState.DRAINING and time.perf_counter() - t0 < args.timeout:
        time.sleep(args.poll)
        sweeper.maybe(timers)
        if advance_queries is not None:
            with connection.execute_wrapper(advance_queries):
                rebind = timers.call("rebind_advance", rebinds.rebind_advance, rebind.pk)
        else:
            rebind = timers.call("rebind_advance", rebinds.rebind_advance, rebind.pk)
        advances += 1
    complete_s = time.perf_counter() - t0
    cpu = meter.stop()
    pg = waits.stop() if waits else None

    moves = ChannelMove.objects.filter(rebind=rebind)
    move_rows = list(moves.values_list("created_at", "finished_at"))

    def since_start(stamps) -> float:
        stamps = [t for t in stamps if t is not None]
        return max(stamps).timestamp() - t0_wall if stamps else float("nan")

    notices = Delivery.objects.filter(pk__in=moves.values("notice"))
    rows = list(notices.values_list("created_at", "finished_at", "state", "attempts"))
    done = [(c, f) for c, f, s, _ in rows if s == "delivered" and f is not None]
    lat = sorted((f - c).total_seconds() * 1000 for c, f in done)
    last = max((f.timestamp() for _, f in done), default=t0_wall) - t0_wall
    result = Drain(
        tasks=args.tasks,
        setup=setup,
        plan_s=plan_s,
        planned=planned,
        complete_s=complete_s,
        state=rebind.state,
        notices=len(rows),
        delivered=len(done),
        retried=sum(1 for *_, a in rows if a > 1),
        last_notice_s=last,
        p50_ms=pct(lat, 0.5),
        p99_ms=pct(lat, 0.99),
        max_ms=lat[-1] if lat else float("nan"),
        sink_unique=sink.stats()["unique"],
        advances=advances,
        moves=len(move_rows),
        moves_planned_s=since_start(c for c, _ in move_rows),
        moves_done_s=since_start(f for _, f in move_rows),
        timers=timers.snapshot(),
        cpu=cpu,
        pg=pg,
        queries=queries,
        advance_queries=advance_queries,
    )
    if advance_queries is not None:
        result.explain = explain_slowest(advance_queries)
    # Configs of this round that still owe something would be delivered during the next one.
    left = Delivery.objects.filter(task__agent=agent, state__in=["pending", "sending"]).count()
    if left:
        print(f"  !! round {n}: {left} deliveries still open after the rebind", flush=True)
    return result


# --- 2. transition cost ----------------------------------------------------------------------


def transitions(task_ids: list[str], states: dict[str, str], seconds: float, threads: int):
    """Threads toggle WORKING <-> INPUT_REQUIRED on disjoint tasks for `seconds`: events/s."""
    from tasks.services import task_transition

    count = [0] * threads
    stop_at = time.perf_counter() + seconds

    def work(k: int) -> Callable[[], None]:
        mine = task_ids[k::threads]

        def run() -> None:
            i = 0
            while time.perf_counter() < stop_at:
                task_id = mine[i % len(mine)]
                to = INPUT_REQUIRED if states[task_id] == WORKING else WORKING
                task_transition(task_id=task_id, to_state=to)
                states[task_id] = to
                count[k] += 1
                i += 1

        return run

    from django.db import connection

    errors: list[BaseException] = []

    def target(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    started = time.perf_counter()
    pool = [threading.Thread(target=target, args=(work(k),)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return sum(count) / elapsed, sum(count)


def transition_cost(ctx: dict) -> dict:
    from django.db.models import Count

    from webhooks.models import Delivery, MoveState, RebindState
    from webhooks.rebinds.checks import RebindRequest
    from webhooks.rebinds.operations import rebind_start

    args, db, sink = ctx["args"], ctx["db"], ctx["sink"]
    sets: dict[str, dict] = {}
    for key, finish_on_old in (("A", None), ("B1", True), ("B2", False)):
        agent = new_agent(f"rb-cost-{key.lower()}")
        ids = make_tasks(agent, args.cost_tasks, sink.base, args.setup_threads, args.setup_procs)
        mark_delivered(db, agent.pk)
        rebind = None
        if finish_on_old is not None:
            rebind = rebind_start(
                RebindRequest(
                    agent=agent,
                    move_from=f"{sink.base}/hooks/v1/",
                    move_to=f"{sink.base}/hooks/v2/",
                    policy="drain",
                    finish_on_old=finish_on_old,
                    deadline_seconds=3600,
                ),
                actor="bench",
            )
            assert rebind.state == RebindState.DRAINING, rebind.state
        sets[key] = {"agent": agent, "ids": ids, "states": dict.fromkeys(ids, WORKING)}
        sets[key]["rebind"] = rebind
    delivery_bench.purge_webhooks_queue()
    vacuum(db)
    from django.utils import timezone

    since = timezone.now()
    rates: dict[str, list[float]] = {k: [] for k in sets}
    for r in range(args.cost_rounds):
        for key, s in sets.items():
            rate, n = transitions(s["ids"], s["states"], args.cost_seconds, args.cost_threads)
            rates[key].append(rate)
            print(f"  cost round {r + 1} {key:<2}: {rate:,.0f} events/s ({n})", flush=True)
    # What the writes were, per set (held for B2's waiting binding, pending otherwise).
    written = {}
    for key, s in sets.items():
        rows = Delivery.objects.filter(task__agent=s["agent"], created_at__gte=since)
        written[key] = dict(
            rows.values_list("state").annotate(n=Count("id")).values_list("state", "n")
        )
        if s["rebind"] is not None:
            moves = s["rebind"].moves.values_list("state", flat=True)
            written[key]["moves"] = sorted(set(moves))
    assert MoveState.NOTICE_PENDING in written["B2"]["moves"], written["B2"]
    return {"rates": rates, "written": written}


# --- report ----------------------------------------------------------------------------------


def print_drains(results: list[Drain], args) -> None:
    print()
    print(
        f"Drain of {args.tasks:,} in-flight tasks (target <= 15 s from rebind_start until the "
        "rebind is completed)"
    )
    print(
        f"{'round':<7}{'plan s':>7}{'planned':>8}{'moves':>7}{'planned s':>10}{'done s':>8}"
        f"{'last notice s':>14}{'complete s':>11}{'state':>10}{'notices':>8}{'delivered':>10}"
        f"{'notices/s':>10}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'retried':>8}{'at sink':>8}"
        f"{'advances':>9}{'load':>6}   CPU s:{'workers':>8}{'pg':>6}{'machine':>8}"
    )
    for i, r in enumerate(results, 1):
        print(
            f"{i:<7}{r.plan_s:>7.2f}{'yes' if r.planned else 'NO':>8}{r.moves:>7}"
            f"{r.moves_planned_s:>10.2f}{r.moves_done_s:>8.2f}{r.last_notice_s:>14.2f}"
            f"{r.complete_s:>11.2f}{r.state:>10}{r.notices:>8}{r.delivered:>10}{r.per_s:>10,.0f}"
            f"{r.p50_ms:>8.0f}{r.p99_ms:>8.0f}{r.max_ms:>8.0f}{r.retried:>8}{r.sink_unique:>8}"
            f"{r.advances:>9}{r.load:>6}        {r.cpu['workers']:>8.1f}{r.cpu['pg']:>6.1f}"
            f"{r.cpu['machine']:>8.1f}"
        )
    if len(results) > 1:

        def med(attr: str) -> float:
            return statistics.median(getattr(r, attr) for r in results)

        print(
            f"{'median':<7}{med('plan_s'):>7.2f}{'':>8}{'':>7}{med('moves_planned_s'):>10.2f}"
            f"{med('moves_done_s'):>8.2f}{med('last_notice_s'):>14.2f}"
            f"{med('complete_s'):>11.2f}{'':>10}{'':>8}{'':>10}{med('per_s'):>10,.0f}"
            f"{med('p50_ms'):>8.0f}{med('p99_ms'):>8.0f}{med('max_ms'):>8.0f}"
        )
    for i, r in enumerate(results, 1):
        print(f"  round {i} setup: {r.setup}")
    print()
    print("The bench process's public calls, per round: calls x total s (mean ms, slowest ms)")
    # rebind_advance is listed even when no round needed one (0 x: the rebind completed
    # inside rebind_start).
    names = sorted({k for r in results for k in r.timers} | {"rebind_advance"})
    for name in names:
        cells = []
        for r in results:
            calls, secs, slowest = r.timers.get(name, [0, 0.0, 0.0])
            cells.append(
                f"{int(calls):>5} x {secs:>6.2f} s ({secs * 1000 / max(calls, 1):>6.1f} ms, "
                f"{slowest * 1000:>6.1f} ms)"
            )
        print(f"  {name:<16}" + "   ".join(cells))
    for i, r in enumerate(results, 1):
        for title, log in (
            ("rebind_start (planning)", r.queries),
            ("the rebind_advance calls", r.advance_queries),
        ):
            if log is None or not log.data:
                continue
            n, secs = log.total()
            print()
            print(
                f"Round {i}: statements run by {title}, {n} in {secs:.2f} s "
                f"({n / r.tasks:.1f} per config, {secs * 1000 / r.tasks:.2f} ms per config): "
                "count, total s, statement"
            )
            for key, count, spent in log.top():
                print(f"  {count:>7} {spent:>7.2f} s  {key}")
    for i, r in enumerate(results, 1):
        if r.pg and r.pg.get("samples"):
            delivery_bench.print_pg_waits(f"drain round {i}", r.pg)
    if results and args.profile:
        print()
        print("EXPLAIN ANALYZE of the slowest SELECTs the last round's rebind_advance calls ran:")
        if not results[-1].explain:
            print("  none: no rebind_advance call ran (the rebind completed inside rebind_start)")
        for line in results[-1].explain:
            print(f"  {line}")


def print_cost(cost: dict, args) -> None:
    rates = cost["rates"]
    print()
    print(
        f"Transition cost: task_transition WORKING <-> INPUT_REQUIRED, {args.cost_threads} "
        f"threads of the bench process on {args.cost_tasks} tasks per set (one push config "
        f"each), {args.cost_seconds:g} s rounds interleaved A/B1/B2 x {args.cost_rounds}; no "
        "webhooks worker running"
    )
    labels = {
        "A": "A  no rebind",
        "B1": "B1 open drain, finish_on_old (pending path)",
        "B2": "B2 open drain, notices undelivered (held path)",
    }
    base = statistics.median(rates["A"])
    for key, values in rates.items():
        med = statistics.median(values)
        ratio = "" if key == "A" else f"   ratio {key}/A {med / base:.3f}"
        runs = " ".join(f"{v:>6,.0f}" for v in values)
        print(f"  {labels[key]:<48} events/s: {runs}   median {med:>6,.0f}{ratio}")
    for key, states in cost["written"].items():
        print(f"  {key}: rows the transitions wrote (status deliveries by state, moves): {states}")


def header(args, db: str, sink: Sink, capacity: dict | None) -> None:
    from django.conf import settings

    load = os.getloadavg()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "webhooks", "tasks", "agents"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.count("\n")
    print(
        f"# rebind bench: {os.cpu_count()} cores shared by the bench process, workers, sink, "
        f"PostgreSQL and Redis; load avg before {load[0]:.2f} {load[1]:.2f}; code {head} "
        f"(+{dirty} changed files in webhooks/ tasks/ agents/)"
    )
    print(
        f"# database {db} (synchronous_commit={pg_setting(db, 'synchronous_commit')} for the "
        "task, registration and rebind transactions; the pump's claims and records commit with "
        "synchronous_commit off, as in production); broker "
        f"{common.BROKER}; {ALLOWED}"
    )
    print(
        f"# webhooks workers: {args.workers} x celery -Q webhooks -P {args.pool} "
        f"-c {args.concurrency}; "
        f"pump window {settings.A2A_WEBHOOK_PUMP_WINDOW}, pump seconds "
        f"{settings.A2A_WEBHOOK_PUMP_SECONDS:g}, linger "
        f"{settings.A2A_WEBHOOK_PUMP_LINGER_SECONDS:g} s, endpoint max in flight "
        f"{settings.A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT} (every task posts to the one sink "
        "origin), cap wait "
        f"{settings.A2A_WEBHOOK_CAP_WAIT_SECONDS:g} s; no beat (the bench sweeps every "
        f"{settings.A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS} s)"
    )
    print(
        f"# rebind: A2A_REBIND_BATCH={settings.A2A_REBIND_BATCH} configs per planning "
        "transaction; drain, no key rotation, move /hooks/v1/ -> /hooks/v2/; advanced by "
        f"this bench calling rebind_advance every {args.poll:g} s (beat's monitor would run "
        f"every {settings.A2A_REBIND_MONITOR_INTERVAL_SECONDS} s)"
    )
    if capacity:
        print(
            f"# sink (uvloop + httptools, 1 process): {capacity['rps']:,.0f} req/s under "
            f"wrk -c16 POST (p99 {capacity['p99']}), {capacity['cpu']:.2f} core busy"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="in-flight tasks per drain")
    parser.add_argument("--rounds", type=int, default=2, help="drain rounds (fresh data each)")
    parser.add_argument("--workers", type=int, default=1, help="webhooks worker processes")
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--poll", type=float, default=0.25, help="s between rebind_advance calls")
    parser.add_argument("--timeout", type=float, default=600, help="give a drain up after s")
    parser.add_argument("--stall", type=float, default=60, help="setup delivery stall, s")
    parser.add_argument("--settle", type=float, default=2.0, help="idle s before a drain")
    parser.add_argument("--setup-procs", type=int, default=2, help="setup processes")
    parser.add_argument("--setup-threads", type=int, default=3, help="threads per setup process")
    parser.add_argument(
        "--mark-setup", action="store_true", help="mark setup deliveries delivered in SQL"
    )
    parser.add_argument("--cost-tasks", type=int, default=300)
    parser.add_argument("--cost-seconds", type=float, default=4.0)
    parser.add_argument("--cost-rounds", type=int, default=3)
    parser.add_argument("--cost-threads", type=int, default=4)
    parser.add_argument("--skip-drain", action="store_true")
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument(
        "--profile", action="store_true", help="pg waits, statements, plans (see above)"
    )
    parser.add_argument("--broker", default=os.environ.get("A2A_BENCH_BROKER_URL", DEFAULT_BROKER))
    add_common_args(parser, DB_NAME)
    args = parser.parse_args()
    capacity_seconds = 3.0
    if args.smoke:
        args.tasks, args.rounds, args.concurrency = 20, 1, 4
        args.setup_procs, args.setup_threads, args.settle = 1, 2, 0.2
        args.cost_tasks, args.cost_seconds, args.cost_rounds, args.cost_threads = 8, 0.5, 1, 2
        capacity_seconds = 1.0
    common.BROKER = args.broker
    delivery_bench.DB_NAME = args.database  # its CpuMeter finds this database's backends by name

    db = fresh_database(args.database)
    os.environ.update(platform_env(db, **ALLOWED, LOG_LEVEL="WARNING"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()

    procs = Procs()
    workers = None
    try:
        sink = Sink(procs)
        capacity = sink.capacity(capacity_seconds)
        delivery_bench.purge_webhooks_queue()
        header(args, db, sink, capacity)
        timers = Timers()
        ctx = {"args": args, "db": db, "sink": sink, "timers": timers}
        if not args.skip_drain:
            workers = Workers(db, args)
            ctx["workers"] = workers
            results = []
            for n in range(1, args.rounds + 1):
                r = drain_round(n, ctx)
                results.append(r)
                print(
                    f"  drain round {n}: plan {r.plan_s:.2f} s, complete {r.complete_s:.2f} s "
                    f"({r.state}), last notice {r.last_notice_s:.2f} s, {r.per_s:,.0f} notices/s, "
                    f"p50 {r.p50_ms:.0f} ms p99 {r.p99_ms:.0f} ms (load {load_average()})",
                    flush=True,
                )
            workers.stop()
            workers = None
            print_drains(results, args)
        if not args.skip_cost:
            print_cost(transition_cost(ctx), args)
        print(f"# load average at the end {load_average()}")
    finally:
        if workers is not None:
            workers.stop()
        procs.stop()


if __name__ == "__main__":
    main()
