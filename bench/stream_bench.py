"""SSE streams across instances (figures, never assertions).

    .venv/bin/python bench/stream_bench.py [--events 300] [--fanout 100]
                                           [--streams 1000,2000,4000] [--transitions 1000]
                                           [--notify-runs 5] [--database NAME] [--smoke]

A fresh PostgreSQL database (--database, default `a2a_bench_stream`, on A2A_BENCH_PG's
server), the broker of A2A_BENCH_BROKER_URL (default Redis database 11), and uvicorn web
instances A and B (latency) and C (capacity) on this machine. The agent is `external`: this
bench process moves its tasks itself through the lifecycle services, i.e. the commit happens
in another process than the instance serving the stream (commit → NOTIFY → the instance's
event hub → the stream).

1. Event-to-stream latency: from the commit returning in this process to the event parsed
   off a stream of instance A and of instance B — one stream per instance, then `--fanout`
   streams per instance on the same task. Target: p99 ≤ 50 ms.
2. Capacity: open streams on instance C in steps; C's RSS per stream and threads; then one
   event fanned out to all of them (time until every stream has it). Target: ≥ 1,000 streams.
3. NOTIFY: how many notifications a transaction appending ten events to one task sends; and
   the event write with and without the NOTIFY: one status event per transaction, written
   as task_transition writes it (`services.lock_task`, then the task store's
   `append_events`), through `PgTaskStore()` and through `PgTaskStore(notify=False)` (the
   store's public switch; A and B keep listening), 1 and 4 committers, events/s, the
   median of --notify-runs alternating runs. The services' own work (state checks, hooks,
   logging) is left out of both, so the NOTIFY's share is of the write alone.

Streams are read on bare sockets (an HTTP client per stream would measure the client).
Tasks are opened with `services.task_send` (SendMessage's write) and moved with
`services.task_transition`: public entry points only. Each figure line ends with the
1-minute load average. `--smoke`: 20 events, 5 streams per instance fanned out, 20 then 40
streams on C, 40 writes per NOTIFY run and one run each (that the bench runs, not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("A2A_BENCH_BROKER_URL", "redis://127.0.0.1:6379/11")

from common import (  # noqa: E402
    BIN,
    Procs,
    add_common_args,
    free_port,
    fresh_database,
    load_average,
    platform_env,
)

DB_NAME = "a2a_bench_stream"
HOST = "127.0.0.1"


# --- Web instances ----------------------------------------------------------------------------


def start_web(procs: Procs, db: str, name: str, **env: str) -> tuple[int, int]:
    """(port, pid) of a uvicorn instance, once /healthz answers."""
    import httpx

    port = free_port()
    cmd = [str(BIN / "uvicorn"), "a2a_platform.asgi:application", "--host", HOST]
    cmd += ["--port", str(port), "--log-level", "warning", "--no-access-log"]
    proc = procs.start(cmd, platform_env(db, A2A_SHUTDOWN_GRACE_SECONDS="0", **env), name=name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited; see var/bench/{name}.log")
        try:
            if httpx.get(f"http://{HOST}:{port}/healthz", timeout=1).status_code == 200:
                return port, proc.pid
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not start")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


# --- Streams on bare sockets ------------------------------------------------------------------


class RawStream:
    """A SubscribeToTask stream; records when each event id arrived."""

    def __init__(self, arrivals: dict[int, list[float]]) -> None:
        self.arrivals = arrivals
        self.first = asyncio.Event()
        self.reader = self.writer = None
        self.task: asyncio.Task | None = None

    async def open(self, port: int, task_id: str) -> RawStream:
        self.reader, self.writer = await asyncio.open_connection(HOST, port)
        request = (
            f"GET /tasks/{task_id}:subscribe HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        )
        self.writer.write(request.encode())
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace")[:200])
        self.task = asyncio.create_task(self._read())
        await self.first.wait()
        return self

    async def _read(self) -> None:
        buffer = b""
        while True:
            chunk = await self.reader.read(65536)
            if not chunk:
                return
            now = time.monotonic()
            buffer += chunk
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                for line in block.split(b"\n"):
                    if line.startswith(b"id: "):
                        self.arrivals[int(line[4:])].append(now)
                        self.first.set()

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.writer is not None:
            self.writer.close()


# --- Moving tasks from this process -----------------------------------------------------------


def new_task(agent) -> str:
    from tasks import services
    from tasks.states import TaskState

    task = services.task_send(
        agent=agent,
        owner="anonymous",
        message={"messageId": os.urandom(8).hex(), "role": "ROLE_USER", "parts": [{"text": "b"}]},
    ).task
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    return str(task.pk)


def progress(task_id: str, stamps: dict[int, float] | None = None) -> int:
    """One status event; with `stamps`, the time the COMMIT returned, keyed by its seq."""
    from django.db import transaction

    from tasks import services
    from tasks.states import TaskState

    with transaction.atomic():
        task = services.task_transition(task_id=task_id, to_state=TaskState.WORKING, message="p")
        if stamps is not None:
            seq = task.last_seq
            transaction.on_commit(lambda: stamps.__setitem__(seq, time.monotonic()))
    return task.last_seq


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def summary(values_s: list[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return (
        f"p50 {statistics.median(ms):6.1f} ms  p99 {percentile(ms, 99):6.1f} ms  "
        f"max {max(ms):6.1f} ms  (n={len(ms)})"
    )


async def latency(agent, ports: dict[str, int], per_instance: int, events: int) -> None:
    task_id = await asyncio.to_thread(new_task, agent)
    arrivals: dict[str, dict[int, list[float]]] = {name: defaultdict(list) for name in ports}
    streams = []
    for name, port in ports.items():
        for _ in range(per_instance):
            streams.append(await RawStream(arrivals[name]).open(port, task_id))
    stamps: dict[int, float] = {}
    seqs = []
    for _ in range(events):
        seqs.append(await asyncio.to_thread(progress, task_id, stamps))
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    for name in ports:
        lat = [max(0.0, t - stamps[seq]) for seq in seqs for t in arrivals[name].get(seq, [])]
        missing = events * per_instance - len(lat)
        print(
            f"  commit → stream on {name}, {per_instance:>4} stream(s): {summary(lat)}"
            + (f"  MISSING {missing}" if missing else "")
            + f"  load {load_average()}",
            flush=True,
        )
    for stream in streams:
        stream.close()


async def capacity(agent, port: int, pid: int, steps: list[int]) -> None:
    task_id = await asyncio.to_thread(new_task, agent)
    arrivals: dict[int, list[float]] = defaultdict(list)
    streams: list[RawStream] = []
    base_rss, base_threads = rss_kib(pid), threads(pid)
    print(f"  instance C at rest: RSS {base_rss / 1024:.1f} MiB, {base_threads} threads")
    sem = asyncio.Semaphore(200)

    async def one() -> RawStream:
        async with sem:
            return await RawStream(arrivals).open(port, task_id)

    for target in steps:
        started = time.monotonic()
        new = target - len(streams)
        streams += await asyncio.gather(*(one() for _ in range(new)))
        opened_in = time.monotonic() - started
        await asyncio.sleep(1.0)
        rss = rss_kib(pid)
        per = (rss - base_rss) / len(streams)
        stamps: dict[int, float] = {}
        seq = await asyncio.to_thread(progress, task_id, stamps)
        deadline = time.monotonic() + 60
        while len(arrivals[seq]) < len(streams) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        got = arrivals[seq]
        lat = [max(0.0, t - stamps[seq]) for t in got]
        print(
            f"  {len(streams):>5} open streams ({new} opened in {opened_in:.1f} s): "
            f"RSS {rss / 1024:7.1f} MiB "
            f"({per:5.1f} KiB/stream), {threads(pid)} threads; one event to all: "
            f"last after {max(lat) * 1000:.0f} ms, {summary(lat)}"
            + (f"  MISSING {len(streams) - len(got)}" if len(got) < len(streams) else "")
            + f"  load {load_average()}",
            flush=True,
        )
    for stream in streams:
        stream.close()


def write_event(store, task_id: str) -> None:
    """One status event in its own transaction, written as task_transition writes it: the task
    locked (`services.lock_task`), the event appended through `store.append_events`."""
    from django.db import transaction
    from django.utils import timezone

    from tasks import services
    from tasks.models import TaskEvent

    with transaction.atomic():
        task = services.lock_task(task_id)
        task.last_seq += 1
        now = timezone.now()
        update = {"taskId": str(task.pk), "contextId": str(task.context_id)}
        update["status"] = {"state": "TASK_STATE_WORKING", "timestamp": now.isoformat()}
        event = TaskEvent(
            task=task,
            seq=task.last_seq,
            kind="statusUpdate",
            payload={"statusUpdate": update},
            created_at=now,
        )
        if not store.append_events(task, [event]):
            raise RuntimeError(f"task {task_id} moved under its lock")


def notify_cost(agent, transitions: int, runs: int) -> None:
    """Event writes/s with and without the NOTIFY (PgTaskStore() and PgTaskStore(notify=False),
    the store's public switch): alternating runs (1 and 4 committers), the median of `runs`
    each (the machine is shared: single runs are noisy)."""
    from django.db import connection

    from tasks.task_store import PgTaskStore

    def burst(store, threads_n: int) -> float:
        task_ids = [new_task(agent) for _ in range(threads_n)]
        per = transitions // threads_n
        barrier = threading.Barrier(threads_n + 1)

        def work(task_id: str) -> None:
            try:
                barrier.wait()
                for _ in range(per):
                    write_event(store, task_id)
            finally:
                connection.close()

        workers = [threading.Thread(target=work, args=(t,)) for t in task_ids]
        for w in workers:
            w.start()
        barrier.wait()
        started = time.monotonic()
        for w in workers:
            w.join()
        return per * threads_n / (time.monotonic() - started)

    stores = {"with NOTIFY": PgTaskStore(), "without NOTIFY": PgTaskStore(notify=False)}
    for threads_n in (1, 4):
        rates: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(runs):
            for name, store in stores.items():
                rates[name].append(burst(store, threads_n))
        for name, values in rates.items():
            print(
                f"  {threads_n} committer(s), {name:<15} {statistics.median(values):6.0f} "
                "event writes/s median  (runs: "
                + ", ".join(f"{r:.0f}" for r in values)
                + f")  load {load_average()}"
            )
        with_, without = (statistics.median(v) for v in rates.values())
        print(
            f"  {threads_n} committer(s): NOTIFY changes the event write's throughput by "
            f"{100 * (with_ - without) / without:+.1f} %"
        )


def coalescing(agent, db: str) -> None:
    """A transaction appending ten events to one task sends one notification."""
    import psycopg
    from django.db import transaction

    from tasks import services
    from tasks.notify import CHANNEL
    from tasks.states import TaskState

    task_id = new_task(agent)
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        with transaction.atomic():
            for _ in range(10):
                services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
        time.sleep(0.3)
        received = list(listener.notifies(timeout=0.5, stop_after=100))
    print(f"  one transaction, 10 events on one task: {len(received)} notification(s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--fanout", type=int, default=100)
    parser.add_argument("--streams", default="1000,2000,4000")
    parser.add_argument("--transitions", type=int, default=1000)
    parser.add_argument("--notify-runs", type=int, default=5, help="runs per NOTIFY figure")
    add_common_args(parser, DB_NAME)
    args = parser.parse_args()
    if args.smoke:
        args.events, args.fanout, args.streams = 20, 5, "20,40"
        args.transitions, args.notify_runs = 40, 1
    steps = [int(s) for s in args.streams.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, max(steps) * 2 + 1000)), hard))

    db = fresh_database(args.database)
    os.environ.update(platform_env(db, LOG_LEVEL="WARNING"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "a2a_platform.settings"
    import django

    django.setup()
    from agents.services import agent_create

    agent = agent_create(
        slug="bench", name="Bench", description="bench", executor="external", is_default=True
    )
    procs = Procs()
    try:
        a_port, _ = start_web(procs, db, "stream-web-a")
        b_port, _ = start_web(procs, db, "stream-web-b")
        c_port, c_pid = start_web(
            procs,
            db,
            "stream-web-c",
            A2A_MAX_STREAMS=str(max(steps) + 100),
            A2A_SSE_KEEPALIVE_SECONDS="600",
        )
        print(
            f"# stream bench: {os.cpu_count()} cores shared by this process (committer and "
            f"stream reader), the web instances and PostgreSQL; load average {load_average()}"
        )
        print("1. event-to-stream latency (commit in this process → event on an instance)")
        ports = {"A": a_port, "B": b_port}
        asyncio.run(latency(agent, ports, 1, args.events))
        asyncio.run(latency(agent, ports, args.fanout, max(50, args.events // 3)))
        print("2. concurrent streams on one instance (C)")
        asyncio.run(capacity(agent, c_port, c_pid, steps))
        print("3. NOTIFY")
        coalescing(agent, db)
        notify_cost(agent, args.transitions, args.notify_runs)
        print(f"# load average at the end {load_average()}")
    finally:
        procs.stop()


if __name__ == "__main__":
    main()
