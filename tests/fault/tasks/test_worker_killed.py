"""Durable executor dispatch with real processes: killed workers and unconsumed queues.

The dispatch row is the truth, the broker message only a hint. Worker and beat run with
short timings (sweep every second, unclaimed after 2 s, leases of 3 s), so the beat sweeper
visibly re-enqueues what a dead worker took with it, or fails the task after its tries.
"""

from __future__ import annotations

import io
import signal
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django_celery_beat.models import PeriodicTask

from a2a_platform.lib import doorbell
from tasks.job_names import RUN_DUE_DISPATCHES_JOB, SWEEP_DISPATCHES_JOB
from tasks.models import DispatchState, EventKind, ExecutorDispatch, Task, TaskEvent
from tasks.states import TERMINAL_STATES, TaskState
from tasks.sweeper import EXECUTOR_LOST_MESSAGE
from tests.factories import task_create, user_message
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

S = TaskState
SWEEP_JOB = SWEEP_DISPATCHES_JOB
TIMINGS = {
    "A2A_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_DISPATCH_UNCLAIMED_SECONDS": "2",
    "A2A_DISPATCH_LEASE_SECONDS": "3",
}


def start_beat(procs, *, sweep_queue: str | None = None, **env: str):
    """Beat (a subprocess reading the test database) firing the sweeper every second."""
    with override_settings(A2A_SWEEP_INTERVAL_SECONDS=1):
        call_command("sync_schedules", stdout=io.StringIO())
    if sweep_queue is not None:
        PeriodicTask.objects.filter(task=SWEEP_JOB).update(queue=sweep_queue)
    sweep = PeriodicTask.objects.get(task=SWEEP_JOB)
    assert sweep.interval.every == 1
    return procs.beat(**TIMINGS, **env)


def open_task(agent, text: str) -> Task:
    return task_create(agent=agent, owner="o", message=user_message(text))


def dispatch_of(task: Task) -> ExecutorDispatch:
    return ExecutorDispatch.objects.filter(task=task).order_by("-id").first()


def wait_settled(task: Task, timeout: float = 25) -> Task:
    return wait_until(
        lambda: Task.objects.filter(pk=task.pk, state__in=TERMINAL_STATES).first(),
        timeout=timeout,
        interval=0.1,
        message=f"task {task.pk} finished",
    )


def statuses(task: Task) -> list[str]:
    return [
        TaskState(e.payload["statusUpdate"]["status"]["state"]).short
        for e in TaskEvent.objects.filter(task=task, kind=EventKind.STATUS).order_by("seq")
    ]


def re_enqueued_in(worker, dispatch: ExecutorDispatch) -> bool:
    return any(
        "dispatch re-enqueued" in line and f"dispatch_id={dispatch.pk}" in line
        for line in worker.log().splitlines()
    )


def reserved_countdown(worker, dispatch: ExecutorDispatch) -> bool:
    """The worker took the dispatch's ETA message off the queue (it waits in its memory)."""
    return any(
        "tasks.run_executor[" in line
        and " received " in line
        and f"'args': '[{dispatch.pk}]'" in line
        and "'eta': None" not in line
        for line in worker.log().splitlines()
    )


def test_countdown_reserved_by_a_killed_worker_is_re_enqueued(scripted_agent, procs):
    """Scenario A: the worker that reserved a WORKING task's countdown message dies."""
    start_beat(procs)
    first = procs.worker(name="first", **TIMINGS)
    task = open_task(scripted_agent, "work 3")
    dispatch = wait_until(
        lambda: ExecutorDispatch.objects.filter(
            task=task, state=DispatchState.PENDING, progress__waited=True
        ).first(),
        timeout=20,
        interval=0.05,
        message="first run re-enqueued with an ETA",
    )
    assert Task.objects.get(pk=task.pk).task_state == S.WORKING
    # The ETA job is published after that commit: killed before taking it, the first worker
    # would leave it on the queue for the second, and nothing would need the sweeper.
    wait_until(lambda: reserved_countdown(first, dispatch), timeout=10, interval=0.05)

    first.kill(signal.SIGKILL)  # the ETA message dies with the worker's memory
    second = procs.worker(name="second", **TIMINGS)

    task = wait_settled(task)
    assert task.task_state == S.COMPLETED
    assert statuses(task) == ["submitted", "working", "completed"]
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.DONE
    assert dispatch.claims == 2
    assert dispatch.claimed_by.startswith("second@")
    assert re_enqueued_in(second, dispatch)
    # Not before its ETA plus the unclaimed grace: the sweeper, not a redelivery, ran it.
    working_at = TaskEvent.objects.get(task=task, seq=2).created_at
    assert task.status_timestamp - working_at >= timedelta(seconds=3 + 2)


def test_unconsumed_dispatch_fails_the_task_visibly_after_its_tries(scripted_agent, procs):
    """Scenario B: nobody consumes the agents queue; the task must not sit in SUBMITTED."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("agents")
    # The sweeper runs on `heartbeat` (sync_schedules' default), which a live worker consumes
    # while nobody consumes `agents`.
    start_beat(procs, sweep_queue="heartbeat", A2A_DISPATCH_MAX_TRIES="2")
    sweeper = procs.worker(
        name="sweeper", queues="heartbeat", A2A_DISPATCH_MAX_TRIES="2", **TIMINGS
    )

    task = open_task(scripted_agent, "hello")
    task = wait_settled(task, timeout=20)

    assert task.task_state == S.FAILED
    text = task.status_message["parts"][0]["text"]
    assert "executor lost" in text
    assert text == EXECUTOR_LOST_MESSAGE.format(tries=2)
    assert statuses(task) == ["submitted", "failed"]
    dispatch = dispatch_of(task)
    assert dispatch.state == DispatchState.LOST
    assert dispatch.enqueues == 2
    assert dispatch.claims == 0
    assert re_enqueued_in(sweeper, dispatch)
    assert broker.llen("agents") == 2  # the first announcement and the sweeper's retry
    broker.delete("agents")


def test_lapsed_lease_of_a_killed_worker_is_re_dispatched(scripted_agent, procs):
    """Scenario C: the worker dies mid-run holding the claim; its lease lapses."""
    start_beat(procs)
    first = procs.worker(name="first", **TIMINGS)
    chunks = 200
    task = open_task(scripted_agent, f"chunks {chunks}")
    wait_until(
        lambda: TaskEvent.objects.filter(task=task, kind=EventKind.ARTIFACT).count() >= 3,
        timeout=20,
        interval=0.02,
        message="executor running",
    )
    first.kill(signal.SIGKILL)
    dispatch = dispatch_of(task)
    assert dispatch.state == DispatchState.CLAIMED
    assert dispatch.claimed_by.startswith("first@")
    partial = task.artifacts.get().chunks
    assert partial < chunks
    assert Task.objects.get(pk=task.pk).task_state == S.WORKING

    second = procs.worker(name="second", **TIMINGS)
    task = wait_settled(task)
    assert task.task_state == S.COMPLETED
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.DONE
    assert dispatch.claims == 2
    assert dispatch.claimed_by.startswith("second@")
    assert re_enqueued_in(second, dispatch)
    # The re-run resumed after the chunks the dead run committed: each chunk is one event.
    artifact = task.artifacts.get(artifact_id="chunks-0")
    assert artifact.complete
    assert artifact.chunks == chunks
    assert artifact.parts == [{"text": f"chunk {i} of {chunks}"} for i in range(1, chunks + 1)]
    sent = [
        part["text"]
        for e in TaskEvent.objects.filter(task=task, kind=EventKind.ARTIFACT).order_by("seq")
        if e.payload["artifactUpdate"]["artifact"]["artifactId"] == "chunks-0"
        for part in e.payload["artifactUpdate"]["artifact"]["parts"]
    ]
    assert sent == [f"chunk {i} of {chunks}" for i in range(1, chunks + 1)]
    seqs = list(TaskEvent.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, task.last_seq + 1))


def assert_each_run_once_by_the_sweeper(procs, tasks: list[Task]) -> None:
    """With beat and a worker started, each echo task completes, claimed once, its dispatch
    announced twice: the ring, then the sweeper's own job."""
    start_beat(procs)
    worker = procs.worker(name="worker", **TIMINGS)
    for task in tasks:
        task = wait_settled(task)
        assert task.task_state == S.COMPLETED
        assert statuses(task) == ["submitted", "working", "completed"]
        dispatch = dispatch_of(task)
        assert dispatch.state == DispatchState.DONE
        assert dispatch.claims == 1
        assert dispatch.enqueues == 2
        assert re_enqueued_in(worker, dispatch)


def test_echo_tasks_whose_due_dispatches_job_was_lost_are_run(agent, procs):
    """Scenario D: new echo tasks ring the doorbell for one run_due_dispatches job, and that
    job is lost (the queue emptied before any worker took it). The bell expires and the
    sweeper publishes each dispatch's own job: every task completes, none twice."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("agents")
    tasks = [open_task(agent, f"m{i}") for i in range(3)]
    assert broker.llen("agents") == 1  # one job for the three
    broker.delete("agents")

    assert_each_run_once_by_the_sweeper(procs, tasks)


def test_echo_tasks_that_rang_for_a_dead_drain_are_run(agent, procs):
    """Scenario E: the doorbell is watched by a drain whose worker was killed (the bell a
    lingering run_due_dispatches job watches, its token in Redis until the bell expires). New
    echo tasks ring it: their rings go to that drain, which nobody hears, and publish no
    job. The bell expires and the sweeper publishes each dispatch's own job: every task completes,
    none twice."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete("agents")
    doorbell.watch(RUN_DUE_DISPATCHES_JOB, "a-killed-workers-drain")
    tasks = [open_task(agent, f"m{i}") for i in range(3)]
    assert broker.llen("agents") == 0  # rings for the dead drain, no job

    assert_each_run_once_by_the_sweeper(procs, tasks)
    assert broker.get(doorbell.key(RUN_DUE_DISPATCHES_JOB)) is None  # expired
