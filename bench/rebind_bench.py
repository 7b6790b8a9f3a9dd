"""Rebind drain time and the cost an open rebind adds to a transition (figures, never
assertions).

    .venv/bin/python bench/rebind_bench.py [--tasks 10000] [--rounds 2] [--workers 1]
        [--cost-tasks 300 --cost-seconds 4 --cost-rounds 3] [--mark-setup] [--profile]

What runs, all on this machine (every process gets DATABASE_URL=.../a2a_rbench,
CELERY_BROKER_URL=redis://127.0.0.1:6379/12 and A2A_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,::1/128):

- a fresh PostgreSQL database (common.fresh_database, migrated);
- the sink of the delivery bench (bench/sink.py: uvloop + httptools, answers 200);
- Celery workers consuming `webhooks` (`-P threads -c 16` by default), started once and kept
  for every drain round; no beat (the bench itself advances the rebind, and runs the
  delivery sweep every A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS, as beat would).

1. Drain, --rounds times, each on fresh data: a new external-executor agent, --tasks tasks
   (task_create, push_config_create at http://127.0.0.1:<sink>/hooks/v1/task-<i>,
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
   The bench process's time inside the rebind services is broken down (wrappers around
   webhooks.rebind's private steps, installed by this bench only).
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

--profile: also py-spy-free instrumentation of the workers (they start through this file's
--celery-shim, which wraps webhooks.pump's claim and record and webhooks.delivery's
notices_delivered with timers before Celery starts), pg_stat_activity sampled during each
drain, and EXPLAIN ANALYZE of the monitor's queries at the end of a round.

Process logs are in var/bench/ (rebind-*.log).
"""

from __future__ import annotations

import argparse
import json
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
from common import BIN, ROOT, Procs, fresh_database, platform_env  # noqa: E402
from delivery_bench import CpuMeter, PgWaits, Sink, pg_setting, run_threads  # noqa: E402

DB_NAME = "a2a_rbench"
DEFAULT_BROKER = "redis://127.0.0.1:6379/12"
ALLOWED = {"A2A_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128"}
LOG_DIR = ROOT / "var" / "bench"
TOKEN = "bench-token"
WORKING = "TASK_STATE_WORKING"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"


# --- timers (the bench process, and the workers under --celery-shim) ------------------------


class Timers:
    """Wall time and calls per wrapped function (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[str, list[float]] = {}  # name -> [calls, seconds, items]

    def wrap(self, name: str, fn: Callable, items: Callable | None = None) -> Callable:
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                n = items(*args, **kwargs) if items else 0
                with self.lock:
                    entry = self.data.setdefault(name, [0, 0.0, 0])
                    entry[0] += 1
                    entry[1] += spent
                    entry[2] += n

        return timed

    def snapshot(self) -> dict[str, list[float]]:
        with self.lock:
            return {k: list(v) for k, v in self.data.items()}

    def reset(self) -> None:
        with self.lock:
            self.data.clear()


class QueryLog:
    """Statements run on this thread's connection (an execute_wrapper): count and wall time
    per statement shape (its first 72 characters)."""

    def __init__(self) -> None:
        self.data: dict[str, list[float]] = {}

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            key = " ".join(sql.split())[:72]
            entry = self.data.setdefault(key, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - started

    def top(self, n: int = 14) -> list[tuple[str, int, float]]:
        rows = sorted(self.data.items(), key=lambda kv: -kv[1][1])[:n]
        return [(k, int(c), s) for k, (c, s) in rows]

    def total(self) -> tuple[int, float]:
        return sum(int(c) for c, _ in self.data.values()), sum(s for _, s in self.data.values())


def celery_shim(out: str, argv: list[str]) -> None:
    """A Celery worker whose pump claim, record and notice record are timed; the totals are
    written to `out` (JSON) every 0.5 s."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from webhooks import delivery, pump

    timers = Timers()
    delivery.notices_delivered = timers.wrap(
        "notices_delivered", delivery.notices_delivered, lambda pks, now: len(pks)
    )
    pump.delivery_record_many = timers.wrap(
        "delivery_record_many", pump.delivery_record_many, lambda results: len(results)
    )
    pump.delivery_claim_batch = timers.wrap("delivery_claim_batch", pump.delivery_claim_batch)

    def dump() -> None:
        while True:
            time.sleep(0.5)
            Path(out).write_text(json.dumps(timers.snapshot()))

    threading.Thread(target=dump, daemon=True).start()
    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", *argv]
    celery_main()


# --- workers ---------------------------------------------------------------------------------


class Workers:
    """Webhooks workers (optionally through --celery-shim), kept across the drain rounds."""

    def __init__(self, db: str, args) -> None:
        self.procs = Procs()
        self.names = [f"rebind-w{i}" for i in range(args.workers)]
        self.shim_files = [LOG_DIR / f"{n}-timers.json" for n in self.names]
        self.list = []
        for name, shim in zip(self.names, self.shim_files, strict=True):
            celery = ["-A", "a2a_platform", "worker", "-Q", "webhooks", "-n", f"{name}@%h"]
            celery += ["-P", args.pool, "-c", str(args.concurrency)]
            celery += ["--without-gossip", "--without-mingle", "-l", "INFO"]
            if args.profile:
                shim.unlink(missing_ok=True)
                cmd = [sys.executable, str(Path(__file__).resolve()), "--celery-shim", str(shim)]
                cmd += ["--", *celery]
            else:
                cmd = [str(BIN / "celery"), *celery]
            self.list.append(self.procs.start(cmd, platform_env(db, **ALLOWED), name=name))
        for proc, name in zip(self.list, self.names, strict=True):
            self.procs.wait_ready(proc, name)

    def pids(self) -> list[int]:
        return [pid for proc in self.list for pid in delivery_bench.pgroup(proc.pid)]

    def timers(self) -> dict[str, list[float]]:
        total: dict[str, list[float]] = {}
        for path in self.shim_files:
            if path.exists():
                for k, v in json.loads(path.read_text()).items():
                    acc = total.setdefault(k, [0, 0.0, 0])
                    for i in range(3):
                        acc[i] += v[i]
        return total

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
    from tasks.services import task_create, task_transition
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
            task = task_create(agent=agent, owner="bench", message=msg)
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
    """What beat's delivery sweeper does (a lease that expired, a lost wake), run from the
    bench process every A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS: without it a retried head whose
    wake was lost stalls (no beat runs here, so the rebind monitor stays out of the figures)."""

    def __init__(self) -> None:
        from django.conf import settings

        self.every = settings.A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS
        self.next = time.monotonic() + self.every

    def maybe(self) -> None:
        from webhooks.services import delivery_sweep

        if time.monotonic() >= self.next:
            delivery_sweep()
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
    timers: dict[str, list[float]]
    worker_timers: dict[str, list[float]]
    cpu: dict[str, float]
    pg: dict | None = None
    queries: QueryLog | None = None
    explain: list[str] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.delivered / self.last_notice_s if self.last_notice_s > 0 else float("nan")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(len(values) * q))]


def install_timers(timers: Timers) -> None:
    """Time webhooks.rebind's steps in this process (bench-only wrappers)."""
    from webhooks import rebind as rb

    for name in (
        "_precheck",
        "_begin",
        "_plan_batch",
        "_settle_finished_on_old",
        "_drain_step",
        "_refresh_counts",
        "_retire_old_key_when_due",
    ):
        setattr(rb, name, timers.wrap(name, getattr(rb, name)))
    from webhooks import channel_moves as cm

    for name in ("move_configs", "notice_body", "_replace_waiting"):
        setattr(cm, name, timers.wrap(f"  {name}", getattr(cm, name)))
    rb.channel_moves.heads.refresh = timers.wrap("  heads.refresh", rb.channel_moves.heads.refresh)


def explain_monitor(rebind_pk) -> list[str]:
    """EXPLAIN ANALYZE of the drain step's count and of the counts the monitor stores."""
    from django.db import connection

    from webhooks import rebind as rb
    from webhooks.models import ChannelMove, Rebind

    rebind = Rebind.objects.get(pk=rebind_pk)
    out = []
    queries = {
        "_on_old(rebind).count()": rb._on_old(rebind).values("pk"),
        "rebind_counts: moves by state": ChannelMove.objects.filter(rebind=rebind)
        .values_list("state")
        .order_by(),
    }
    for label, qs in queries.items():
        sql, params = qs.query.sql_with_params()
        with connection.cursor() as cur:
            cur.execute(f"EXPLAIN (ANALYZE, BUFFERS) SELECT count(*) FROM ({sql}) q", params)
            plan = [r[0] for r in cur.fetchall()]
        out.append(f"{label}:")
        out += [f"    {line}" for line in plan]
    return out


def drain_round(n: int, ctx: dict) -> Drain:
    from webhooks.models import ChannelMove, Delivery, RebindState
    from webhooks.rebind import RebindRequest, rebind_advance, rebind_start

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
    before = workers.timers()
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
    queries = QueryLog()
    if args.profile:
        from django.db import connection

        with connection.execute_wrapper(queries):
            rebind = rebind_start(req, actor="bench")
    else:
        rebind = rebind_start(req, actor="bench")
    plan_s = time.perf_counter() - t0
    planned = rebind.state == RebindState.DRAINING and rebind.moves_planned
    advances = 0
    sweeper = Sweeper()
    while rebind.state == RebindState.DRAINING and time.perf_counter() - t0 < args.timeout:
        time.sleep(args.poll)
        sweeper.maybe()
        rebind = rebind_advance(rebind.pk)
        advances += 1
    complete_s = time.perf_counter() - t0
    cpu = meter.stop()
    pg = waits.stop() if waits else None

    notices = Delivery.objects.filter(
        pk__in=ChannelMove.objects.filter(rebind=rebind).values("notice")
    )
    rows = list(notices.values_list("created_at", "finished_at", "state", "attempts"))
    done = [(c, f) for c, f, s, _ in rows if s == "delivered" and f is not None]
    lat = sorted((f - c).total_seconds() * 1000 for c, f in done)
    last = max((f.timestamp() for _, f in done), default=t0_wall) - t0_wall
    after = workers.timers()
    worker_timers = {
        k: [v[i] - before.get(k, [0, 0.0, 0])[i] for i in range(3)] for k, v in after.items()
    }
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
        timers=timers.snapshot(),
        worker_timers=worker_timers,
        cpu=cpu,
        pg=pg,
        queries=queries,
    )
    if args.profile:
        result.explain = explain_monitor(rebind.pk)
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
    from webhooks.rebind import RebindRequest, rebind_start

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
        f"{'round':<7}{'plan s':>7}{'planned':>8}{'last notice s':>14}{'complete s':>11}"
        f"{'state':>10}{'notices':>8}{'delivered':>10}{'notices/s':>10}{'p50 ms':>8}"
        f"{'p99 ms':>8}{'max ms':>8}{'retried':>8}{'at sink':>8}{'advances':>9}"
        f"   CPU s:{'workers':>8}{'pg':>6}{'machine':>8}"
    )
    for i, r in enumerate(results, 1):
        print(
            f"{i:<7}{r.plan_s:>7.2f}{'yes' if r.planned else 'NO':>8}{r.last_notice_s:>14.2f}"
            f"{r.complete_s:>11.2f}{r.state:>10}{r.notices:>8}{r.delivered:>10}{r.per_s:>10,.0f}"
            f"{r.p50_ms:>8.0f}{r.p99_ms:>8.0f}{r.max_ms:>8.0f}{r.retried:>8}{r.sink_unique:>8}"
            f"{r.advances:>9}        {r.cpu['workers']:>8.1f}{r.cpu['pg']:>6.1f}"
            f"{r.cpu['machine']:>8.1f}"
        )
    if len(results) > 1:

        def med(attr: str) -> float:
            return statistics.median(getattr(r, attr) for r in results)

        print(
            f"{'median':<7}{med('plan_s'):>7.2f}{'':>8}{med('last_notice_s'):>14.2f}"
            f"{med('complete_s'):>11.2f}{'':>10}{'':>8}{'':>10}{med('per_s'):>10,.0f}"
            f"{med('p50_ms'):>8.0f}{med('p99_ms'):>8.0f}{med('max_ms'):>8.0f}"
        )
    for i, r in enumerate(results, 1):
        print(f"  round {i} setup: {r.setup}")
    print()
    print("Where the bench process's time went (rebind services, per round: calls, total s)")
    names = sorted({k for r in results for k in r.timers})
    for name in names:
        cells = []
        for r in results:
            calls, secs, _ = r.timers.get(name, [0, 0.0, 0])
            cells.append(
                f"{int(calls):>5} x {secs:>6.2f} s ({secs * 1000 / max(calls, 1):>6.1f} ms)"
            )
        print(f"  {name:<26}" + "   ".join(cells))
    if any(r.worker_timers for r in results):
        print()
        print("Workers (--celery-shim timers, summed over pump threads; per round)")
        for name in sorted({k for r in results for k in r.worker_timers}):
            cells = []
            for r in results:
                calls, secs, items = r.worker_timers.get(name, [0, 0.0, 0])
                per_item = f", {secs * 1000 / items:.2f} ms/item" if items else ""
                cells.append(
                    f"{int(calls):>6} calls {secs:>7.2f} s "
                    f"({secs * 1000 / max(calls, 1):.1f} ms/call, {items / max(calls, 1):.1f} "
                    f"items{per_item})"
                )
            print(f"  {name:<22}" + "   ".join(cells))
    for i, r in enumerate(results, 1):
        if r.queries and r.queries.data:
            n, secs = r.queries.total()
            print()
            print(
                f"Round {i}: statements run by rebind_start (planning), {n} in {secs:.2f} s "
                f"({n / r.tasks:.1f} per config, {secs * 1000 / r.tasks:.2f} ms per config; "
                f"the rest of the {r.plan_s:.2f} s is Python): count, total s, statement"
            )
            for key, count, spent in r.queries.top():
                print(f"  {count:>7} {spent:>7.2f} s  {key}")
    for i, r in enumerate(results, 1):
        if r.pg and r.pg.get("samples"):
            delivery_bench.print_pg_waits(f"drain round {i}", r.pg)
    if results and results[-1].explain:
        print()
        print("EXPLAIN ANALYZE at the end of the last round (the rebind completed):")
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
        f"-c {args.concurrency}{' (via --celery-shim timers)' if args.profile else ''}; "
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
    if len(sys.argv) > 2 and sys.argv[1] == "--celery-shim":
        rest = sys.argv[3:]
        celery_shim(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest)
        return
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
    parser.add_argument("--profile", action="store_true", help="worker timers, pg waits, plans")
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    args = parser.parse_args()
    common.BROKER = args.broker
    delivery_bench.DB_NAME = DB_NAME  # its CpuMeter finds this database's backends by name

    db = fresh_database(DB_NAME)
    os.environ.update(platform_env(db, **ALLOWED, LOG_LEVEL="WARNING"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()

    procs = Procs()
    workers = None
    try:
        sink = Sink(procs)
        capacity = sink.capacity()
        delivery_bench.purge_webhooks_queue()
        header(args, db, sink, capacity)
        timers = Timers()
        install_timers(timers)
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
                    f"p50 {r.p50_ms:.0f} ms p99 {r.p99_ms:.0f} ms (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
            workers.stop()
            workers = None
            print_drains(results, args)
        if not args.skip_cost:
            print_cost(transition_cost(ctx), args)
    finally:
        if workers is not None:
            workers.stop()
        procs.stop()


if __name__ == "__main__":
    main()
