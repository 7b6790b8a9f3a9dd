"""The protocol app alone, in one process, without HTTP: what the web process spends per
request on its own work (figures, never assertions).

    .venv/bin/python bench/web_bench.py [--requests 4000] [--rounds 3] [--concurrency 16]
                                        [--history 5000] [--only GetTask]
                                        [--database NAME] [--smoke]

What runs: a database of the bench's own (--database, default `a2a_bench_web`, on
A2A_BENCH_PG's PostgreSQL, created afresh, migrated) with one echo agent and a client API
key; in this process (pinned to CPU 0 on a machine with two cores or more, PostgreSQL left
free), --concurrency coroutines call the
ASGI application (`a2a_platform.asgi.application`, the entry point uvicorn serves) directly,
with a request scope and body, as a server would after parsing the HTTP. No socket, no HTTP
parser, no client: what is measured is the platform's code and its database work.

- **agent card**: `GET /.well-known/agent-card.json`;
- **GetTask**: `GET /tasks/{id}` (HTTP+JSON) of a completed echo task (one user message, one
  artifact), with the API key;
- **SendMessage returnImmediately**: `POST /message:send`, the task opened and its dispatch
  announced (the executor job is not run: no worker here).

Before the rounds, --history returnImmediately sends fill the tables and `VACUUM ANALYZE`
reads their statistics, as autovacuum would on a database in use: the statements the
warm-up prepares are planned for tables of their size (planned on nearly empty tables, a
lookup by key can walk an index that grows with every round). Each figure (or, with
--only, the ones named) runs --rounds times, the figures alternating, after a warm-up.
Per request: this process's CPU (`time.process_time`, the ORM threads included), its
PostgreSQL backends' (from /proc) and the wall time; medians of the rounds. For an A/B of
two commits, run it in each worktree, alternating. The whole platform under HTTP load,
against the official SDK: bench/sdk_compare.py. Public entry points only: the ASGI
application, the services (`task_answer`, `worker_heartbeat`: what a worker's heartbeat job
writes, standing in for the worker this bench does not start). `--smoke`: 50 requests, one
round, a history of 50 and a warm-up of 20 (that the bench runs, not a figure).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ECHO_AGENT,
    ROOT,
    add_common_args,
    fresh_database,
    load_average,
    platform_env,
)

DATABASE = "a2a_bench_web"
FIGURES = ("agent card", "GetTask", "SendMessage returnImmediately")


def _cpu_of(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _backends(url: str) -> list[int]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchall()
    return [pid for (pid,) in rows]


def _analyze(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


async def _call(app, scope: dict, body: bytes) -> tuple[int, bytes]:
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # a client that stays connected
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--history", type=int, default=5000, help="tasks opened before the statistics are read"
    )
    parser.add_argument(
        "--only", action="append", choices=FIGURES, help="this figure only (repeatable)"
    )
    add_common_args(parser, DATABASE)
    args = parser.parse_args()
    args.warmup = 500
    if args.smoke:
        args.requests, args.rounds, args.history, args.warmup = 50, 1, 50, 20

    url = fresh_database(args.database)
    env = platform_env(url, LOG_LEVEL="WARNING", ALLOWED_HOSTS="127.0.0.1,localhost")
    run = {"cwd": ROOT, "env": env, "check": True, "capture_output": True, "text": True}
    subprocess.run([sys.executable, "manage.py", *ECHO_AGENT], **run)
    key = subprocess.run(
        [sys.executable, "manage.py", "create_api_key", "bench", "--name", "bench"], **run
    ).stdout.strip()
    token = key.splitlines()[-1]
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")
    sys.path.insert(0, str(ROOT))
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    asyncio.run(_bench(args, url, token))


async def _bench(args, url: str, token: str) -> None:
    from a2a_platform.asgi import application
    from a2a_platform.lib.orm import run_orm
    from tasks import services
    from tasks.models import Task
    from tasks.states import TaskState
    from webhooks import services as webhooks_services

    # What a server and a worker would do: the app's lifespan (the event hub), and a worker's
    # heartbeat for the readiness gate (the card is served only once a worker is live).
    def worker_beat() -> None:
        webhooks_services.worker_heartbeat(
            hostname="bench@web_bench", queues=["agents", "webhooks", "heartbeat"]
        )

    await run_orm(worker_beat)

    startup, started = asyncio.Queue(), asyncio.Event()
    await startup.put({"type": "lifespan.startup"})

    async def lifespan_send(message: dict) -> None:
        started.set()

    lifespan = asyncio.create_task(application({"type": "lifespan"}, startup.get, lifespan_send))
    await started.wait()

    auth = [(b"authorization", f"Bearer {token}".encode()), (b"a2a-version", b"1.0")]
    json_headers = [*auth, (b"content-type", b"application/a2a+json")]

    # A completed echo task to read: opened by a send, answered as the executor answers it.
    status, body = await _call(
        application, _scope("POST", "/message:send", json_headers), _send_body("seed", True)
    )
    assert status == 200, body
    task_id = json.loads(body)["task"]["id"]
    artifact = {"artifactId": "echo", "name": "echo", "parts": [{"text": "seed"}]}
    await run_orm(lambda: services.task_answer(task_id=task_id, artifact=artifact))
    state = await run_orm(lambda: Task.objects.get(pk=task_id).state)
    assert state == TaskState.COMPLETED, state

    counter = iter(range(10**9))
    figures = every = {
        "agent card": lambda: (_scope("GET", "/.well-known/agent-card.json", []), b""),
        "GetTask": lambda: (_scope("GET", f"/tasks/{task_id}", auth), b""),
        "SendMessage returnImmediately": lambda: (
            _scope("POST", "/message:send", json_headers),
            _send_body(f"m-{next(counter)}", True),
        ),
    }

    if args.only:
        figures = {name: make for name, make in figures.items() if name in args.only}

    async def drive(make, n: int) -> None:
        left = n

        async def one_client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                scope, body = make()
                status, answer = await _call(application, scope, body)
                if status != 200:
                    raise SystemExit(f"{scope['method']} {scope['path']}: {status} {answer!r}")

        await asyncio.gather(*(one_client() for _ in range(args.concurrency)))

    # Tables of some size, their statistics read (the module docstring says why).
    await drive(every["SendMessage returnImmediately"], args.history)
    _analyze(url)
    for make in figures.values():  # warm-up: prepared statements, caches, pool
        await drive(make, args.warmup)
    backends = _backends(url)
    print(
        f"# {args.requests} requests a round, {args.rounds} rounds, {args.concurrency} at a "
        f"time; {len(backends)} PostgreSQL backends; load average {load_average()}"
    )
    seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in figures}
    for _ in range(args.rounds):
        await run_orm(worker_beat)
        for name, make in figures.items():
            backends = _backends(url)
            cpu, db, wall = time.process_time(), _cpu_of(backends), time.perf_counter()
            await drive(make, args.requests)
            n = args.requests
            seen[name].append(
                (
                    (time.process_time() - cpu) / n * 1e3,
                    (_cpu_of(backends) - db) / n * 1e3,
                    (time.perf_counter() - wall) / n * 1e3,
                )
            )
    for name, rows in seen.items():
        python, postgres, wall = (statistics.median(col) for col in zip(*rows, strict=True))
        runs = ", ".join(f"{r[0]:.3f}/{r[1]:.3f}" for r in rows)
        print(
            f"  {name:30} per request (median): web CPU {python:.3f} ms, PostgreSQL CPU "
            f"{postgres:.3f} ms, wall {wall:.3f} ms   (rounds, web/PostgreSQL: {runs})"
        )
    print(f"# load average at the end {load_average()}")
    await startup.put({"type": "lifespan.shutdown"})
    await lifespan


def _send_body(message_id: str, return_immediately: bool) -> bytes:
    message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": "hello"}]}
    body = {"message": message, "configuration": {"returnImmediately": return_immediately}}
    return json.dumps(body).encode()


if __name__ == "__main__":
    main()
