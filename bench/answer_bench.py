"""An executor's answer alone, in one process: what the worker and PostgreSQL spend per echo
task once it is claimed (figures, never assertions).

    .venv/bin/python bench/answer_bench.py [--tasks 1500] [--rounds 3] [--database NAME]
        [--smoke]

What runs: a database of the bench's own (--database, default `a2a_bench_answer`, on
A2A_BENCH_PG's PostgreSQL, created afresh, migrated) with one echo agent; in this process,
one thread (pinned to CPU 0 on a machine with two cores or more, PostgreSQL left free)
answers --tasks SUBMITTED tasks:

- **answer, claim's row**: what the echo executor calls, `services.task_answer` with the task
  row its quick claim read (`seen`; read here before the clock starts, as the claim's
  statement reads it): written without locking the task first (one transaction: WORKING,
  the artifact and COMPLETED, their events and outbox rows written together);
- **answer, locked**: `services.task_answer` without that row: the task locked first, as
  every other caller's answer;
- **three services** (the baseline): `task_transition` to WORKING, `task_add_artifact`,
  `task_transition` to COMPLETED, the same events as three transactions, as an executor that
  reports each step on its own does;
- **the worker's batches**: `runner.run_due` until every task is answered, as a
  `tasks.run_due_dispatches` job runs them: claims of up to ten (one statement each), each
  batch's answers from the claims' rows in one transaction, its outbox rows in one statement.
  Its figure includes the claims, which the three above do not pay.

The three alternate --rounds times each on fresh tasks, so drift in the machine's load hits
all alike. Per answer: this process's CPU (`time.process_time`), its PostgreSQL backend's
(from /proc) and the wall time, medians of the rounds; the ratios of each answer to the three
services, and of the claim's row to the locked answer.
Opening the tasks is not measured. The whole platform under load, against the official SDK:
bench/sdk_compare.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ECHO_AGENT,
    PG,
    ROOT,
    add_common_args,
    fresh_database,
    load_average,
    platform_env,
)

DATABASE = "a2a_bench_answer"
ARTIFACT = {"artifactId": "echo", "name": "echo", "parts": [{"text": "hello"}]}


def _backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1500, help="answers per round")
    parser.add_argument("--rounds", type=int, default=3)
    add_common_args(parser, DATABASE)
    args = parser.parse_args()
    warmup = 50
    if args.smoke:
        args.tasks, args.rounds, warmup = 20, 1, 5

    url = fresh_database(args.database)
    env = platform_env(url, LOG_LEVEL="WARNING")
    subprocess.run(
        [sys.executable, "manage.py", *ECHO_AGENT],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection

    from agents.models import Agent
    from tasks import services
    from tasks.executors.runner import run_due
    from tasks.models import Task
    from tasks.states import TaskState

    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    agent = Agent.objects.get(slug="bench")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchone()
    print(
        f"# {args.tasks} answers a round, {args.rounds} rounds each, alternating; PG {PG}/"
        f"{args.database}; load average {load_average()}"
    )

    def open_tasks(n: int) -> list:
        message = {"role": "ROLE_USER", "parts": [{"text": "hello"}]}
        return [
            services.task_send(
                agent=agent, owner="bench", message={**message, "messageId": f"m-{time.time_ns()}"}
            ).task.pk
            for _ in range(n)
        ]

    def each(one):
        def run(tasks, rows) -> None:
            for task_id in tasks:
                one(task_id, rows[task_id])

        return run

    def answer(task_id, row) -> None:
        services.task_answer(task_id=task_id, artifact=ARTIFACT)

    def answer_from_row(task_id, row) -> None:
        services.task_answer(task_id=task_id, artifact=ARTIFACT, seen=row)

    def three_services(task_id, row) -> None:
        services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
        services.task_add_artifact(task_id=task_id, artifact=ARTIFACT, last_chunk=True)
        services.task_transition(task_id=task_id, to_state=TaskState.COMPLETED)

    def batches(tasks, rows) -> None:
        left = len(tasks)
        while left > 0:
            ran = run_due(worker="bench")
            if not ran:
                sys.exit(f"run_due found nothing due with {left} tasks unanswered")
            left -= ran

    ways = {
        "answer, claim's row": each(answer_from_row),
        "answer, locked": each(answer),
        "three services": each(three_services),
        "the worker's batches": batches,
    }
    seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    for way in ways.values():  # warm-up: prepared statements, caches
        tasks = open_tasks(warmup)
        way(tasks, Task.objects.in_bulk(tasks))
    for _ in range(args.rounds):
        for name, way in ways.items():
            tasks = open_tasks(args.tasks)
            rows = Task.objects.in_bulk(tasks)  # as the quick claims read them
            cpu, db, wall = time.process_time(), _backend_cpu(backend), time.perf_counter()
            way(tasks, rows)
            n = len(tasks)
            seen[name].append(
                (
                    (time.process_time() - cpu) / n * 1e3,
                    (_backend_cpu(backend) - db) / n * 1e3,
                    (time.perf_counter() - wall) / n * 1e3,
                )
            )
    medians = {}
    for name, rows in seen.items():
        python, postgres, wall = (statistics.median(col) for col in zip(*rows, strict=True))
        medians[name] = (python, postgres, wall)
        runs = ", ".join(f"{r[0]:.2f}/{r[1]:.2f}" for r in rows)
        print(
            f"  {name:20} per answer (median): Python CPU {python:.2f} ms, PostgreSQL CPU "
            f"{postgres:.2f} ms, wall {wall:.2f} ms   (rounds, Python/PostgreSQL: {runs})"
        )

    def ratio(name: str, base: str) -> None:
        one, other = medians[name], medians[base]
        # /proc counts CPU in clock ticks: a tiny run can measure 0 (then no ratio).
        x = [f"{a / b:.2f}x" if b else "n/a" for a, b in zip(one, other, strict=True)]
        print(f"# {name} / {base}: Python {x[0]}, PostgreSQL {x[1]}, wall {x[2]}")

    ratio("answer, claim's row", "answer, locked")
    ratio("answer, locked", "three services")
    print(f"# load average at the end {load_average()}")


if __name__ == "__main__":
    main()
