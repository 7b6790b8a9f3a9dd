"""Webhook delivery throughput and latency (figures, never assertions).

    .venv/bin/python bench/delivery_bench.py [--events 3000] [--pool threads --concurrency 16]
        [--rate 200 --seconds 10] [--broker redis://127.0.0.1:6379/12] [--profile]
        [--runs drain:1:1,live:50:2] [--no-sweeper] [--database NAME] [--smoke]

What runs, all on this machine (every process gets A2A_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,
so plain http to loopback is a permitted webhook destination):

- a fresh PostgreSQL database (common.fresh_database; --database, default
  a2a_delivery_bench, on A2A_BENCH_PG's server) and the Redis broker of --broker
  (default A2A_BENCH_BROKER_URL, else DB 12); the `webhooks` queue is purged between runs;
- a sink (bench/sink.py): one asyncio/uvloop process parsing HTTP/1.1 with httptools, answering
  200 to everything and recording receive time, X-A2A-Task-Id, X-A2A-Task-Seq and webhook-id.
  Its own capacity is measured first with wrk (POST, 16 connections) and printed;
- Celery workers consuming only `webhooks` (`-P threads -c 16` by default; the pool and the
  concurrency used are printed in the header), 1 or 2 processes, started fresh for each run;
- the sweeper as deployed (`make run`): celery beat with the synced schedules and one worker
  on `heartbeat` (`--no-sweeper` leaves both out: then a delivery nobody re-enqueues stalls);
- producer processes (--producer-procs, each with --producer-threads): every measured event
  is an artifactUpdate written by tasks.services.task_add_artifact on a task with a push
  config registered through webhooks.services.push_config_create (one transaction each: task
  row lock, TaskEvent, the outbox hook writes the Delivery row, the deliver job is published
  after commit). The agent is an external-executor agent, so no executor ever runs. The
  commit time of an event is stamped by an on_commit callback registered ahead of the service
  call (an outer atomic block), so it is taken before the job is published.
  Setup shortcut: the snapshot delivery each registration writes is marked delivered in SQL
  and the queue purged, so only the events below are measured.

Figures:

- Throughput, "batch 1": one event on each of --events tasks (one push config each).
  "batch 50": bursts of 50 events on one task (--events / 50 tasks, one config each), each
  event its own transaction, back to back. Two modes:
    drain  the events are committed while no webhooks worker runs (Delivery rows and one
           deliver job per event wait in PostgreSQL and Redis); then the workers start.
           deliv/s = events / (last receipt - first receipt): the delivery path's capacity.
    live   the workers run while the producers commit the events as fast as they can.
           deliv/s = events / (last receipt - first commit); "produced/s" is the commit rate,
           which bounds it.
  "jobs" counts deliver jobs run and "idle" those that delivered nothing (worker logs);
  a run during which the Redis server restarted (its run id changed) is repeated, up to 3
  times, and flagged if it still was;
  "swept" counts sweeps that found a due head during the run (each then rings for a pump unless
  one is claiming: webhooks/delivery/bell.py).
  "load" is the 1-minute load average at the end of the run (other tenants included).
  CPU ms per delivery over the delivery window: the webhooks workers, this database's
  PostgreSQL backends (in live runs the window includes the producers' statements), and the
  whole machine (other tenants of the machine included).
  Target (reported, not asserted): >= 1,000 durable deliveries/s sustained. "Durable": an
  event's TaskEvent and Delivery rows are committed (synchronous_commit as the server has it,
  printed in the header) before anything is sent; the pump's claims and records commit with
  synchronous_commit off (a lost one re-sends with the same webhook-id), as in production.
- Producer cost: CPU ms per event of the producer processes and of PostgreSQL while the
  drain runs commit their events (no webhooks worker running).
- Latency: --rate events/s offered for --seconds on 200 tasks in turn (a paced schedule:
  event i is due at t0 + i/rate; "late p99" is how far behind schedule the producers fell),
  with 1 and 2 worker processes; latency = sink receive time - commit time. The workers start
  with the run, so events of the first --warmup seconds (default 3) are left out of the
  percentiles and their slowest is shown as "warm-up".
  Target (reported, not asserted): p99 <= 50 ms at 200 events/s on a 2-core machine.
- Baseline: the same paced load on tasks without a push config; each event is POSTed once by
  the producer process that committed it, with one shared httpx.Client, right after commit
  (fire and forget: no outbox row, no retry, no signature, like the official SDKs' push
  senders); no webhooks worker runs. The ratio durable / baseline is printed.
- --profile: py-spy samples the worker of the 1-worker batch-1 drain run (wall time per job
  phase, on-CPU time per phase and per library; raw samples in var/bench/pyspy-*.txt), and
  pg_stat_activity is sampled during that run and during the 2-worker latency run (what the
  bench database's active backends wait on, and in which statement).

Public entry points only: the producers write through tasks.services (task_send,
task_transition, task_add_artifact) and webhooks.services.push_config_create, and copy the
baseline's event with tasks.hooks.register_event_hook; the body is encoded by
webhooks.bindings.body_bytes, as deliveries are. The py-spy phases are read from outside (a
sample's stack, by function and file name): a phase no sample matched is printed as such, so
a renamed function shows instead of a silent 0 %.
`--smoke`: 20 events per throughput run, the runs drain:1:1 and live:50:1, 2 s at 20 events/s
per latency run after a 0.5 s warm-up (1 worker and the baseline), one producer process of
two threads, the sink measured for 1 s (that the bench runs, not a figure).

Process logs are in var/bench/, with each latency run's samples (latency-*.tsv: commit time,
ms). Everything shares this machine's cores; the header prints the core count and the load
average before the runs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import (  # noqa: E402
    BIN,
    ROOT,
    Procs,
    add_common_args,
    free_port,
    fresh_database,
    load_average,
    platform_env,
)

DEFAULT_BROKER = "redis://127.0.0.1:6379/12"
DB_NAME = "a2a_delivery_bench"
ALLOWED = {"A2A_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}
LOG_DIR = ROOT / "var" / "bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")
LATENCY_TASKS = 200
TOKEN = "bench-token"


# --- the sink -------------------------------------------------------------------------------


class Sink:
    def __init__(self, procs: Procs) -> None:
        self.port = free_port()
        self.proc = procs.start(
            [sys.executable, "-u", str(ROOT / "bench" / "sink.py"), "--port", str(self.port)],
            dict(os.environ),
            name="sink",
        )
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/hook"
        self.client = httpx.Client(base_url=self.base, timeout=30, trust_env=False)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.stats()
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the sink did not start; see var/bench/sink.log") from None
                time.sleep(0.05)

    def stats(self) -> dict:
        return self.client.get("/_stats").json()

    def dump(self) -> list[tuple[float, str, int, str]]:
        return [tuple(r) for r in self.client.get("/_dump").json()["records"]]

    def reset(self) -> None:
        self.client.post("/_reset")

    def wait_for(self, unique: int, stall: float) -> bool:
        """Until `unique` distinct webhook-ids arrived; False after `stall` s of no progress."""
        last, last_change = -1, time.monotonic()
        while True:
            got = self.stats()["unique"]
            if got >= unique:
                return True
            if got != last:
                last, last_change = got, time.monotonic()
            elif time.monotonic() - last_change > stall:
                return False
            time.sleep(0.02)

    def capacity(self, seconds: float = 3) -> dict | None:
        """The sink's own req/s under wrk (POST of a delivery-sized body, 16 connections)."""
        if shutil.which("wrk") is None:
            return None
        script = LOG_DIR / "sink_post.lua"
        script.write_text(
            'wrk.method = "POST"\nwrk.body = string.rep("x", 600)\n'
            'wrk.headers["Content-Type"] = "application/a2a+json"\n'
        )
        before = cpu_seconds([self.proc.pid])
        out = subprocess.run(
            ["wrk", "-t1", "-c16", f"-d{seconds:.0f}s", "--latency", "-s", str(script), self.base],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        used = cpu_seconds([self.proc.pid]) - before
        self.reset()
        return {
            "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p99": re.search(r"99%\s+(\S+)", out).group(1),
            "cpu": used / seconds,
        }


# --- CPU accounting from /proc ----------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def pgroup(pgid: int) -> list[int]:
    """Every process of a process group (a worker and any pool children)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def db_backends() -> list[int]:
    """PostgreSQL backends connected to the bench database (their title names it)."""
    pids = []
    needle = f" {DB_NAME} ".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"postgres: ") and needle in cmd:
            pids.append(int(entry.name))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / CLK_TCK


def machine_busy() -> float:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


class CpuMeter:
    """CPU seconds used between start() and stop() by the workers, the bench database's
    PostgreSQL backends and the whole machine. A thread samples every pid every 0.2 s, so a
    process that starts in between counts from zero and one that exits keeps its last sample."""

    def __init__(self, worker_pids: Callable[[], list[int]] = list) -> None:
        self.worker_pids = worker_pids
        self.first: dict[str, dict[int, float]] = {"workers": {}, "pg": {}}
        self.last: dict[str, dict[int, float]] = {"workers": {}, "pg": {}}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self, initial: bool = False) -> None:
        for name, pids in (("workers", self.worker_pids()), ("pg", db_backends())):
            for pid in pids:
                value = cpu_seconds([pid])
                self.first[name].setdefault(pid, value if initial else 0.0)
                self.last[name][pid] = value

    def _loop(self) -> None:
        while not self.stopping.wait(0.2):
            self._sample()

    def start(self) -> CpuMeter:
        self._sample(initial=True)
        self.machine = machine_busy()
        self.thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self.stopping.set()
        self.thread.join()
        self._sample()
        out = {"machine": machine_busy() - self.machine}
        for name in ("workers", "pg"):
            out[name] = sum(v - self.first[name][pid] for pid, v in self.last[name].items())
        return out


class PgWaits:
    """Samples pg_stat_activity of the bench database every 20 ms: what active backends are
    doing (wait event and the start of the statement)."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.counts: collections.Counter = collections.Counter()
        self.samples = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import psycopg

        with psycopg.connect(self.db, autocommit=True) as conn:
            while not self.stopping.wait(0.02):
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU'), "
                    "left(regexp_replace(query, '\\s+', ' ', 'g'), 60) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND state = 'active' "
                    "AND pid <> pg_backend_pid()"
                ).fetchall()
                self.samples += 1
                self.counts.update(rows)

    def start(self) -> PgWaits:
        self.thread.start()
        return self

    def stop(self) -> dict:
        self.stopping.set()
        self.thread.join()
        return {"samples": self.samples, "top": self.counts.most_common(12)}


# --- the producer (runs in child processes) ---------------------------------------------------


@dataclass
class Produced:
    stamps: dict[tuple[str, int], float] = field(default_factory=dict)  # (task, seq) -> commit
    late: list[float] = field(default_factory=list)  # start - due time (paced runs), seconds
    cpu: float = 0.0  # producer processes' CPU seconds

    @property
    def first(self) -> float:
        return min(self.stamps.values())

    @property
    def last(self) -> float:
        return max(self.stamps.values())


class Producer:
    """Commits events through the lifecycle services, from threads of one process."""

    def __init__(self, sink_url: str) -> None:
        from django.db import transaction

        from tasks.hooks import register_event_hook
        from tasks.services import task_add_artifact
        from webhooks.bindings import body_bytes

        self.transaction = transaction
        self.task_add_artifact = task_add_artifact
        self.body_bytes = body_bytes
        self.sink_url = sink_url
        self.local = threading.local()
        self.sender: httpx.Client | None = None

        def capture(writes) -> None:  # the baseline's in-memory copy of the event
            if getattr(self.local, "capture", False):
                task, events = writes[-1]
                event = events[-1]
                self.local.event = (str(task.pk), event.seq, event.payload)

        register_event_hook(capture)

    def emit(self, task_id: str, tag: str) -> tuple[tuple[str, int], float]:
        """One artifactUpdate through task_add_artifact: ((task, seq), commit time)."""
        box: list[float] = []
        artifact = {"artifactId": tag, "name": "out", "parts": [{"text": f"chunk {tag} " * 8}]}
        with self.transaction.atomic():
            self.transaction.on_commit(lambda: box.append(time.time()))
            task = self.task_add_artifact(task_id=task_id, artifact=artifact)
        return (str(task.pk), task.last_seq), box[0]

    def emit_fire_and_forget(self, task_id: str, tag: str) -> tuple[tuple[str, int], float]:
        """The baseline: commit the same event, then POST it once from this thread."""
        self.local.capture = True
        try:
            key, committed = self.emit(task_id, tag)
        finally:
            self.local.capture = False
        task_pk, seq, payload = self.local.event
        with contextlib.suppress(httpx.HTTPError):  # fire and forget
            self.sender.post(
                self.sink_url,
                content=self.body_bytes(payload).encode(),
                headers={
                    "Content-Type": "application/a2a+json",
                    "X-A2A-Task-Id": task_pk,
                    "X-A2A-Task-Seq": str(seq),
                    "webhook-id": str(uuid.uuid4()),
                    "X-A2A-Notification-Token": TOKEN,
                },
            )
        return key, committed

    def bursts(self, plan: list[list[str]], threads: int, tag: str) -> Produced:
        """Each inner list is one burst (events on one task, in order); threads take bursts."""
        out = Produced()
        queue = iter(enumerate(plan))
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    item = next(queue, None)
                if item is None:
                    return
                n, burst = item
                for i, task_id in enumerate(burst):
                    key, committed = self.emit(task_id, f"{tag}-{n}-{i}")
                    out.stamps[key] = committed

        run_threads(work, threads)
        return out

    def paced(self, spec: dict, t0: float) -> Produced:
        """Event i (of this process's share) due at t0 + i / rate, on tasks[i % len(tasks)]."""
        out = Produced()
        rate, tasks, baseline = spec["rate"], spec["tasks"], spec["baseline"]
        mine = iter(range(spec["index"], spec["total"], spec["procs"]))
        lock = threading.Lock()
        if baseline:
            self.sender = httpx.Client(timeout=10, trust_env=False)

        def work() -> None:
            while True:
                with lock:
                    i = next(mine, None)
                if i is None:
                    return
                due = t0 + i / rate
                delay = due - time.time()
                if delay > 0:
                    time.sleep(delay)
                out.late.append(time.time() - due)
                emit = self.emit_fire_and_forget if baseline else self.emit
                key, committed = emit(tasks[i % len(tasks)], f"{spec['tag']}-{i}")
                out.stamps[key] = committed

        run_threads(work, spec["threads"])
        if self.sender is not None:
            self.sender.close()
        return out


def run_threads(fn: Callable[[], None], count: int) -> None:
    from django.db import connection

    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=target) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _producer_child(spec: dict, ready, go, t0, results) -> None:
    """A producer process (multiprocessing spawn): set up Django, wait for the start, produce,
    return the stamps and the CPU it used."""
    import django

    django.setup()
    producer = Producer(spec["sink_url"])
    ready.put(spec["index"])
    go.wait()
    cpu = sum(os.times()[:2])
    if spec["kind"] == "bursts":
        out = producer.bursts(spec["plan"], spec["threads"], spec["tag"])
    else:
        out = producer.paced(spec, t0.value)
    results.put(
        {
            "stamps": [(k[0], k[1], t) for k, t in out.stamps.items()],
            "late": out.late,
            "cpu": sum(os.times()[:2]) - cpu,
        }
    )


def run_producers(specs: list[dict]) -> Produced:
    """One spawned process per spec; all start together once every one is set up."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    t0 = ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_producer_child, args=(s, ready, go, t0, results), daemon=True)
        for s in specs
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    t0.value = time.time() + 0.2
    go.set()
    out = Produced()
    for _ in procs:
        part = results.get(timeout=3600)
        out.stamps.update({(task, seq): t for task, seq, t in part["stamps"]})
        out.late += part["late"]
        out.cpu += part["cpu"]
    for p in procs:
        p.join(timeout=30)
    return out


# --- setup (bench process) ---------------------------------------------------------------------


def make_tasks(agent, count: int, *, push_url: str | None, threads: int) -> list[str]:
    from tasks.services import task_send, task_transition
    from webhooks.services import push_config_create

    ids: list[str] = []
    todo = iter(range(count))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            msg = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "go"}]}
            task = task_send(agent=agent, owner="bench", message=msg).task
            task_transition(task_id=task.pk, to_state="TASK_STATE_WORKING")
            if push_url:
                config = {"url": push_url, "id": "sink", "token": TOKEN}
                push_config_create(task=task, config=config)
            with lock:
                ids.append(str(task.pk))

    run_threads(work, threads)
    return ids


def settle_setup(db: str) -> None:
    """Setup shortcut: mark the registration snapshots delivered, purge the queue."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE webhooks_delivery SET state='delivered', finished_at=now() "
            "WHERE state IN ('pending','sending')"
        )
        conn.execute("VACUUM ANALYZE")
    purge_webhooks_queue()


def purge_webhooks_queue() -> int:
    """Drop waiting `webhooks` jobs (not FLUSHDB: that would drop kombu's queue bindings
    under the running beat and heartbeat worker)."""
    from a2a_platform.celery import app

    with app.connection_for_write() as conn:
        return conn.default_channel.queue_purge("webhooks") or 0


def broker_id() -> str:
    """The Redis server's run id: it changes when the server restarts (other tenants of this
    machine restart the shared Redis in fault tests; a run across a restart lost its jobs)."""
    import redis

    try:
        return redis.Redis.from_url(common.BROKER).info("server")["run_id"]
    except redis.RedisError:
        return "down"


def attempt(run: Callable, tries: int = 3):
    """A run, repeated (up to `tries`) while the broker restarted under it."""
    for i in range(tries):
        before = broker_id()
        result = run()
        result.broker_restarted = broker_id() != before or before == "down"
        if not result.broker_restarted or i == tries - 1:
            return result
        print("  (the broker restarted during the run: repeating it)", flush=True)
        time.sleep(5)
    return result


def open_deliveries(db: str) -> dict:
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT state, count(*), extract(epoch FROM min(next_attempt_at) - now()) "
            "FROM webhooks_delivery WHERE state IN ('pending','sending') GROUP BY state"
        ).fetchall()
    return {state: (n, round(float(due), 1)) for state, n, due in rows}


# --- workers ----------------------------------------------------------------------------------


def log_text(name: str) -> str:
    path = LOG_DIR / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


class Workers:
    def __init__(self, db: str, count: int, args, tag: str) -> None:
        self.procs = Procs()
        self.names = [f"dw-{tag}-{i}" for i in range(count)]
        self.list = [
            self.procs.celery_worker(
                db,
                name,
                queues="webhooks",
                pool=args.pool,
                concurrency=args.concurrency,
                wait=False,
                **ALLOWED,
            )
            for name in self.names
        ]
        for proc, name in zip(self.list, self.names, strict=True):
            self.procs.wait_ready(proc, name)

    def pids(self) -> list[int]:
        return [pid for proc in self.list for pid in pgroup(proc.pid)]

    def job_counts(self, timeout: float = 10.0) -> tuple[int, int, int]:
        """(deliver jobs finished, of which delivered nothing, jobs that raised), once every
        job received has logged its end (a pump lingers after its last delivery), or after
        `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            received = jobs = idle = failed = 0
            for name in self.names:
                for line in log_text(name).splitlines():
                    if "webhooks.deliver[" not in line:
                        continue
                    if " received" in line:
                        received += 1
                    elif "succeeded" in line:
                        jobs += 1
                        idle += "'claimed 0," in line
                    elif "raised" in line:
                        failed += 1
            if jobs + failed >= received or time.monotonic() > deadline:
                return jobs, idle, failed
            time.sleep(0.1)

    def stop(self) -> None:
        self.procs.stop()


class Sweeper:
    """celery beat (database scheduler, synced schedules) and one worker on `heartbeat`."""

    NAME = "dw-heartbeat"

    def __init__(self, procs: Procs, db: str) -> None:
        procs.celery_worker(db, self.NAME, queues="heartbeat", pool="threads", concurrency=2)
        procs.beat(db, "dw-beat", **ALLOWED)
        self.mark = 0

    def start_window(self) -> None:
        self.mark = len(log_text(self.NAME))

    def swept(self) -> int:
        """Sweeps that found a due head (and woke a pump unless one was claiming) since
        start_window()."""
        text = log_text(self.NAME)[self.mark :]
        return sum(
            int(m.group(1))
            for m in re.finditer(
                r"webhooks\.sweep_deliveries\[[^\]]*\] succeeded in [^:]*: (\d+)", text
            )
        )


# --- runs --------------------------------------------------------------------------------------


@dataclass
class Throughput:
    mode: str
    batch: int
    workers: int
    events: int
    produced_per_s: float
    delivered: int
    per_s: float
    seconds: float
    duplicates: int
    jobs: int
    idle_jobs: int
    failed_jobs: int
    swept: int | None
    cpu: dict[str, float]
    producer_cpu: dict[str, float] | None = None
    stuck: dict | None = None
    broker_restarted: bool = False
    load: float = field(default_factory=lambda: os.getloadavg()[0])


def first_receipts(records) -> dict[tuple[str, int], float]:
    out: dict[tuple[str, int], float] = {}
    for t, task_id, seq, _ in records:
        key = (task_id, seq)
        if key not in out or t < out[key]:
            out[key] = t
    return out


def split(items: list, parts: int) -> list[list]:
    return [items[i::parts] for i in range(parts)]


def throughput_run(mode: str, batch: int, workers: int, ctx: dict) -> Throughput:
    args, db, sink = ctx["args"], ctx["db"], ctx["sink"]
    plan = [[t] * batch for t in ctx["tasks"][batch]]
    events = sum(len(b) for b in plan)
    tag = f"{mode}{batch}x{workers}"
    purge_webhooks_queue()
    sink.reset()
    if ctx["sweeper"]:
        ctx["sweeper"].start_window()
    specs = [
        {"kind": "bursts", "sink_url": sink.url, "plan": part, "threads": args.producer_threads}
        | {"tag": f"{tag}-{k}", "index": k}
        for k, part in enumerate(split(plan, args.producer_procs))
    ]
    pool = Workers(db, workers, args, tag) if mode == "live" else None
    try:
        meter = CpuMeter(pool.pids).start() if pool else None
        producer_meter = CpuMeter().start()
        started = time.time()
        produced = run_producers(specs)
        producer_cpu = producer_meter.stop() | {"producer": produced.cpu}
        if mode == "drain":
            pool = Workers(db, workers, args, tag)
            meter = CpuMeter(pool.pids).start()
        spy = start_profile(pool.list[0].pid, db) if ctx.get("profile_this") else None
        complete = sink.wait_for(events, args.stall)
        cpu = meter.stop()
        if spy is not None:
            ctx["profile"] = finish_profile(spy)
        stuck = None if complete else open_deliveries(db)
        jobs, idle, failed = pool.job_counts()  # once the last jobs logged their result
    finally:
        if pool is not None:
            pool.stop()
    records = sink.dump()
    got = first_receipts(records)
    receipts = [got[k] for k in produced.stamps if k in got]
    if receipts:
        span = max(receipts) - (min(receipts) if mode == "drain" else produced.first)
    else:
        span = float("nan")
    return Throughput(
        mode=mode,
        batch=batch,
        workers=workers,
        events=events,
        produced_per_s=events / max(produced.last - started, 1e-9),
        delivered=len(receipts),
        per_s=len(receipts) / span if span > 0 else float("nan"),
        seconds=span,
        duplicates=len(records) - len({r[3] for r in records}),
        jobs=jobs,
        idle_jobs=idle,
        failed_jobs=failed,
        swept=ctx["sweeper"].swept() if ctx["sweeper"] else None,
        cpu=cpu,
        producer_cpu=producer_cpu if mode == "drain" else None,
        stuck=stuck,
    )


@dataclass
class Latency:
    name: str
    events: int
    offered_per_s: float
    late_p99_ms: float
    lat_ms: list[float]  # after the warm-up
    duplicates: int
    swept: int | None
    cpu: dict[str, float]
    warmup_max_ms: float = float("nan")  # the slowest event of the warm-up
    broker_restarted: bool = False
    load: float = field(default_factory=lambda: os.getloadavg()[0])

    def pct(self, q: float) -> float:
        if not self.lat_ms:
            return float("nan")
        return self.lat_ms[min(len(self.lat_ms) - 1, int(len(self.lat_ms) * q))]


def latency_run(name: str, workers: int, ctx: dict) -> Latency:
    args, db, sink = ctx["args"], ctx["db"], ctx["sink"]
    baseline = workers == 0
    purge_webhooks_queue()
    sink.reset()
    if ctx["sweeper"]:
        ctx["sweeper"].start_window()
    pool = Workers(db, workers, args, f"lat{workers}") if workers else None
    try:
        return _latency(name, pool, baseline, args, db, sink, ctx)
    finally:
        if pool is not None:
            pool.stop()


def _latency(name: str, pool, baseline: bool, args, db: str, sink: Sink, ctx: dict) -> Latency:
    base = {
        "kind": "paced",
        "sink_url": sink.url,
        "tasks": ctx["plain"] if baseline else ctx["tasks"][1][:LATENCY_TASKS],
        "rate": args.rate,
        "total": int(args.rate * args.seconds),
        "procs": args.producer_procs,
        "threads": args.producer_threads,
        "baseline": baseline,
        "tag": f"lat{len(pool.list) if pool else 0}",
    }
    meter = CpuMeter(pool.pids if pool else list).start()
    waits = PgWaits(db).start() if args.profile and pool and len(pool.list) == 2 else None
    produced = run_producers([base | {"index": k} for k in range(args.producer_procs)])
    sink.wait_for(len(produced.stamps), args.stall)
    cpu = meter.stop() | {"producer": produced.cpu}
    if waits is not None:
        ctx["latency_waits"] = waits.stop()
    records = sink.dump()
    got = first_receipts(records)
    samples = sorted((t, (got[k] - t) * 1000) for k, t in produced.stamps.items() if k in got)
    with open(LOG_DIR / f"latency-{base['tag']}.tsv", "w") as out:  # commit time, latency ms
        out.writelines(f"{t:.6f}\t{ms:.3f}\n" for t, ms in samples)
    # Freshly started workers warm up (connections, prepared statements, key cache): the
    # first --warmup seconds of events are left out of the percentiles; their max is shown.
    steady_from = produced.first + args.warmup
    lat = sorted(ms for t, ms in samples if t >= steady_from)
    warmup = [ms for t, ms in samples if t < steady_from]
    late = sorted(produced.late)
    return Latency(
        name=name,
        events=len(produced.stamps),
        offered_per_s=len(produced.stamps) / max(produced.last - produced.first, 1e-9),
        late_p99_ms=late[int(len(late) * 0.99) - 1] * 1000 if late else float("nan"),
        lat_ms=lat,
        duplicates=len(records) - len({r[3] for r in records}),
        swept=ctx["sweeper"].swept() if ctx["sweeper"] and not baseline else None,
        cpu=cpu,
        warmup_max_ms=max(warmup, default=float("nan")),
    )


# --- profiling ---------------------------------------------------------------------------------


def start_profile(pid: int, db: str) -> dict:
    """Two py-spy recordings of one worker (wall time with idle threads; on-CPU: only the
    thread holding the GIL) and the PostgreSQL wait sampler."""
    spies = {}
    for kind, flags in (("wall", ["--idle"]), ("cpu", ["--gil"])):
        out = LOG_DIR / f"pyspy-worker-{kind}.txt"
        cmd = [str(BIN / "py-spy"), "record", "--pid", str(pid), "--format", "raw"]
        cmd += ["--rate", "250", "--threads", "--nonblocking", *flags, "--output", str(out)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        spies[kind] = (proc, out)
    return {"spies": spies, "pg": PgWaits(db).start()}


def finish_profile(running: dict) -> dict:
    result = {"pg": running["pg"].stop()}
    for kind, (proc, out) in running["spies"].items():
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        result[kind] = summarize_profile(out, only_jobs=kind == "wall")
    return result


# Phases of a delivery pump: the first of these functions found in a sample's stack.
_PHASES = (
    ("claim: _headers (keys, sign)", "delivery_headers (webhooks/delivery/headers.py"),
    ("claim: the rest", "delivery_claim_batch ("),
    ("record", "delivery_record_many ("),
    ("sender loop (transport, asyncio)", "webhook-sender"),
    ("bell / publish", "webhooks/delivery/bell.py"),
    ("pump, other (waiting on sends)", "run_pump ("),
)
# A sample belongs to the pump when one of these is in its stack (its thread or a sender).
_PUMP_FRAMES = ("run_pump (",)
# Libraries, by the innermost frame's file.
_LIBS = (
    ("django ORM (models, sql)", ("django/db/models",)),
    ("django db backend + psycopg", ("django/db/backends", "psycopg", "django/db/utils")),
    ("celery + kombu + redis", ("celery/", "kombu/", "redis/", "billiard/", "vine/")),
    ("asyncio + httptools", ("asyncio/", "httptools/")),
    ("cryptography + jwt", ("cryptography/", "jwt/")),
    ("logging", ("logging/",)),
    ("threading / queue", ("threading.py", "queue.py")),
)


def summarize_profile(path: Path, *, only_jobs: bool) -> dict:
    """py-spy raw samples: share per job phase and per library (innermost frame)."""
    if not path.exists():
        return {}
    phases: collections.Counter = collections.Counter()
    libs: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or (only_jobs and not any(f in stack for f in _PUMP_FRAMES)):
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        phase = next((label for label, f in _PHASES if f in stack), "outside the job (celery)")
        phases[phase] += n
        leaf = frames[-1]
        libs[next((label for label, keys in _LIBS if any(k in leaf for k in keys)), "other")] += n
    return {"total": total, "phases": phases.most_common(), "libs": libs.most_common()}


# --- report ------------------------------------------------------------------------------------


def per_event(cpu: dict[str, float] | None, n: int, keys: tuple[str, ...]) -> str:
    if not cpu or not n:
        return ""
    return " ".join(f"{cpu.get(k, 0.0) * 1000 / n:>7.2f}" for k in keys)


def print_throughput(results: list[Throughput]) -> None:
    keys = ("workers", "pg", "machine")
    print()
    print("Durable delivery throughput (target >= 1,000 deliveries/s sustained)")
    print(
        f"{'mode':<6}{'batch':>6}{'workers':>8}{'events':>7}{'produced/s':>11}{'delivered':>10}"
        f"{'deliv/s':>8}{'secs':>7}{'dups':>5}{'jobs':>6}{'idle':>6}{'swept':>6}{'load':>6}"
        f"   CPU ms/delivery:{'workers':>8}{'pg':>8}{'machine':>8}"
    )
    for r in results:
        print(
            f"{r.mode:<6}{r.batch:>6}{r.workers:>8}{r.events:>7}{r.produced_per_s:>11.0f}"
            f"{r.delivered:>10}{r.per_s:>8.0f}{r.seconds:>7.1f}{r.duplicates:>5}{r.jobs:>6}"
            f"{r.idle_jobs:>6}{'-' if r.swept is None else r.swept:>6}{r.load:>6.1f}"
            f"                  {per_event(r.cpu, r.delivered, keys)}"
        )
        if r.stuck:
            print(f"      !! stalled: open deliveries {r.stuck} (state: (count, due in s))")
        if r.failed_jobs:
            print(f"      !! {r.failed_jobs} deliver jobs raised (see var/bench/dw-*.log)")
        if r.broker_restarted:
            print("      !! the broker restarted during this run (not by the bench)")
    drains = [r for r in results if r.producer_cpu]
    if drains:
        n = sum(r.events for r in drains)
        prod = sum(r.producer_cpu["producer"] for r in drains) * 1000 / n
        pg = sum(r.producer_cpu["pg"] for r in drains) * 1000 / n
        print(
            f"producer cost (drain runs, no webhooks worker): {prod:.2f} ms CPU/event in the "
            f"producer processes + {pg:.2f} ms in PostgreSQL"
        )


def print_latency(results: list[Latency], rate: float, warmup: float) -> None:
    keys = ("producer", "workers", "pg", "machine")
    print()
    print(
        f"Event-to-receipt latency at {rate:.0f} events/s offered "
        f"(commit -> sink receive, after a {warmup:g} s warm-up; target p99 <= 50 ms)"
    )
    print(
        f"{'path':<37}{'events':>7}{'offered/s':>10}{'recv':>6}{'dups':>5}"
        f"{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}{'max ms':>8}{'warm-up':>8}{'late p99':>9}"
        f"{'swept':>6}{'load':>6}"
        f"   CPU ms/event:{'producer':>9}{'workers':>8}{'pg':>8}{'machine':>8}"
    )
    for r in results:
        print(
            f"{r.name:<37}{r.events:>7}{r.offered_per_s:>10.0f}{len(r.lat_ms):>6}"
            f"{r.duplicates:>5}{r.pct(0.5):>8.1f}{r.pct(0.9):>8.1f}{r.pct(0.99):>8.1f}"
            f"{(r.lat_ms[-1] if r.lat_ms else float('nan')):>8.1f}{r.warmup_max_ms:>8.1f}"
            f"{r.late_p99_ms:>9.1f}"
            f"{'-' if r.swept is None else r.swept:>6}{r.load:>6.1f}               "
            f"{per_event(r.cpu, r.events, keys)}"
        )
    for r in results:
        if r.broker_restarted:
            print(f"  !! {r.name}: the broker restarted during this run (not by the bench)")
    base = next((r for r in results if r.name.startswith("fire-and-forget")), None)
    if base and base.lat_ms:
        for r in results:
            if r is not base and r.lat_ms:
                print(
                    f"ratio {r.name} / fire-and-forget: p50 x{r.pct(0.5) / base.pct(0.5):.0f}, "
                    f"p99 x{r.pct(0.99) / base.pct(0.99):.0f}"
                )


def print_profile(profile: dict) -> None:
    if not profile:
        return
    for kind, title in (
        ("wall", "wall time of the pump threads"),
        ("cpu", "on-CPU time (the thread holding the GIL), whole worker"),
    ):
        prof = profile.get(kind) or {}
        total = prof.get("total")
        if not total:
            continue
        print()
        print(f"py-spy, one worker, {title} ({total} samples)")
        for label, n in prof["phases"]:
            print(f"  {label:<40}{100 * n / total:>6.1f} %")
        seen = {label for label, _ in prof["phases"]}
        for label, frame in _PHASES:
            if label not in seen:
                print(f"  {label:<40}  none: no sample had {frame!r} (renamed or moved?)")
        print("  by library (innermost frame):")
        for label, n in prof["libs"]:
            print(f"    {label:<38}{100 * n / total:>6.1f} %")
    print_pg_waits("drain batch 1, 1 worker", profile.get("pg"))


def print_pg_waits(title: str, pg: dict | None) -> None:
    if not pg or not pg.get("samples"):
        return
    print()
    print(
        f"PostgreSQL during {title}: active backends of the bench database, sampled every "
        f"20 ms ({pg['samples']} samples); mean number per wait event and statement"
    )
    for (wait, query), n in pg["top"]:
        print(f"  {n / pg['samples']:>5.2f}  {wait:<28} {query}")


def pg_setting(db: str, name: str) -> str:
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        return conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0]


# --- main --------------------------------------------------------------------------------------

ALL_RUNS = [(m, b, w) for m in ("drain", "live") for b in (1, 50) for w in (1, 2)]


def parse_runs(text: str | None) -> list[tuple[str, int, int]]:
    if not text:
        return ALL_RUNS
    runs = []
    for item in text.split(","):
        mode, batch, workers = item.split(":")
        runs.append((mode, int(batch), int(workers)))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=3000, help="events per throughput run")
    parser.add_argument("--pool", default="threads", help="Celery pool of the workers")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--producer-procs", type=int, default=2)
    parser.add_argument("--producer-threads", type=int, default=3)
    parser.add_argument("--rate", type=float, default=200.0, help="offered events/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency run length")
    parser.add_argument(
        "--warmup", type=float, default=3.0, help="latency: first seconds left out of the figures"
    )
    parser.add_argument("--stall", type=float, default=30.0, help="give up after s idle")
    parser.add_argument("--broker", default=os.environ.get("A2A_BENCH_BROKER_URL", DEFAULT_BROKER))
    parser.add_argument("--runs", help="throughput runs, e.g. drain:1:1,live:50:2 (mode:batch:w)")
    parser.add_argument("--no-sweeper", action="store_true", help="no beat, no heartbeat worker")
    parser.add_argument("--profile", action="store_true", help="py-spy the drain:1:1 worker")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    add_common_args(parser, DB_NAME)
    args = parser.parse_args()
    capacity_seconds = 3.0
    if args.smoke:
        args.events, args.runs, args.rate, args.seconds, args.warmup = (
            20,
            "drain:1:1,live:50:1",
            20,
            2,
            0.5,
        )
        args.producer_procs, args.producer_threads, args.concurrency = 1, 2, 4
        capacity_seconds = 1.0
    common.BROKER = args.broker
    # db_backends() finds this database's PostgreSQL backends by name.
    globals()["DB_NAME"] = args.database

    db = fresh_database(args.database)
    os.environ.update(platform_env(db, **ALLOWED, LOG_LEVEL="WARNING"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from agents.services import agent_create

    procs = Procs()
    try:
        sink = Sink(procs)
        capacity = sink.capacity(capacity_seconds)
        agent = agent_create(
            slug="bench-ext", name="Bench", description="delivery bench", executor="external"
        )
        started = time.monotonic()
        threads = args.producer_procs * args.producer_threads
        tasks = {
            1: make_tasks(agent, args.events, push_url=sink.url, threads=threads),
            50: make_tasks(agent, max(1, args.events // 50), push_url=sink.url, threads=threads),
        }
        plain = make_tasks(agent, LATENCY_TASKS, push_url=None, threads=threads)
        settle_setup(db)
        setup_s = time.monotonic() - started
        sweeper = None if args.no_sweeper else Sweeper(procs, db)
        ctx = {"args": args, "db": db, "sink": sink, "tasks": tasks, "plain": plain}
        ctx["sweeper"] = sweeper

        load = os.getloadavg()
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "webhooks", "tasks"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.count("\n")
        print(
            f"# webhook delivery bench: {os.cpu_count()} cores shared by producers, workers, "
            f"sink, PostgreSQL and Redis; load avg before {load[0]:.2f} {load[1]:.2f}; "
            f"code {head} (+{dirty} changed files in webhooks/ tasks/)"
        )
        print(
            f"# webhooks workers: celery -Q webhooks -P {args.pool} -c {args.concurrency}; "
            f"producers: {args.producer_procs} processes x {args.producer_threads} threads; "
            f"sweeper: {'beat + heartbeat worker' if sweeper else 'off'}; "
            f"broker {args.broker}"
        )
        print(
            f"# durable = each event's TaskEvent and Delivery rows committed before the deliver "
            f"job is published, with PostgreSQL's synchronous_commit="
            f"{pg_setting(db, 'synchronous_commit')}; the pump's claims and records commit "
            f"with synchronous_commit off (webhooks/delivery/claim_record.py relaxed_commits: "
            f"a crash that loses one re-sends the delivery with the same webhook-id); "
            f"transport: webhooks/delivery/transport.py (aiohttp {aiohttp.__version__})"
        )
        if capacity:
            print(
                f"# sink (uvloop + httptools, 1 process): {capacity['rps']:,.0f} req/s under "
                f"wrk -c16 POST (p99 {capacity['p99']}), {capacity['cpu']:.2f} core busy"
            )
        print(f"# setup: {sum(map(len, tasks.values())) + len(plain)} tasks in {setup_s:.0f} s")

        if not args.skip_throughput:
            results = []
            for mode, batch, workers in parse_runs(args.runs):
                ctx["profile_this"] = args.profile and (mode, batch, workers) == ("drain", 1, 1)
                r = attempt(lambda m=mode, b=batch, w=workers: throughput_run(m, b, w, ctx))
                results.append(r)
                print(
                    f"  {mode} batch {batch} x{workers}: {r.per_s:.0f}/s "
                    f"({r.delivered}/{r.events}, load {load_average()})",
                    flush=True,
                )
            print_throughput(results)
            print_profile(ctx.get("profile", {}))

        if not args.skip_latency:
            lat = []
            paths = [
                ("durable, 1 worker", 1),
                ("durable, 2 workers", 2),
                ("fire-and-forget baseline (no worker)", 0),
            ]
            if args.smoke:  # the 2-worker run is the 1-worker run's code with another count
                paths = [paths[0], paths[2]]
            for name, workers in paths:
                lat.append(attempt(lambda n=name, w=workers: latency_run(n, w, ctx)))
                print(f"  {name}: done (load {load_average()})", flush=True)
            print_latency(lat, args.rate, args.warmup)
            print_pg_waits("the 2-worker latency run", ctx.get("latency_waits"))
        print(f"# load average at the end {load_average()}")
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
