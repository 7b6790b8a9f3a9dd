"""Built-in executors on a real Celery worker process, against the real test database.

The test process opens tasks through the lifecycle services (which publish the executor job
after commit); the worker claims the dispatch, runs the executor and releases it. Everything
is observed in the database, as a client would.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from tasks import services
from tasks.dispatch import dispatch_claim, dispatch_finish
from tasks.models import DispatchState, EventKind, ExecutorDispatch, Task, TaskEvent
from tasks.states import TERMINAL_STATES, TaskState
from tests.factories import task_create, user_message
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

S = TaskState


def open_task(agent, text: str) -> Task:
    return task_create(agent=agent, owner="o", message=user_message(text))


def wait_state(task: Task, *states: TaskState, timeout: float = 20) -> Task:
    return wait_until(
        lambda: Task.objects.filter(pk=task.pk, state__in=states).first(),
        timeout=timeout,
        interval=0.05,
        message=f"task {task.pk} in {[s.short for s in states]}",
    )


def dispatch_of(task: Task) -> ExecutorDispatch:
    return ExecutorDispatch.objects.filter(task=task).order_by("-id").first()


def statuses(task: Task) -> list[str]:
    return [
        TaskState(e.payload["statusUpdate"]["status"]["state"]).short
        for e in TaskEvent.objects.filter(task=task, kind=EventKind.STATUS).order_by("seq")
    ]


def status_text(task: Task) -> str:
    return task.status_message["parts"][0]["text"]


def assert_events_gap_free(task: Task) -> None:
    seqs = list(TaskEvent.objects.filter(task=task).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, task.last_seq + 1))


def job_results(worker, result: str) -> int:
    """How many executor jobs the worker log shows returning `result`."""
    return sum(
        1
        for line in worker.log().splitlines()
        if "tasks.run_executor[" in line and "succeeded" in line and f"'{result}'" in line
    )


def test_echo_task_runs_to_completion(agent, procs):
    procs.worker()
    task = open_task(agent, "hello there")
    task = wait_state(task, *TERMINAL_STATES)

    assert task.task_state == S.COMPLETED
    assert statuses(task) == ["submitted", "working", "completed"]
    kinds = list(TaskEvent.objects.filter(task=task).order_by("seq").values_list("kind", flat=True))
    assert kinds == ["status", "status", "artifact", "status"]
    assert_events_gap_free(task)
    artifact = task.artifacts.get()
    assert artifact.parts == [{"text": "hello there"}]
    assert artifact.complete
    dispatch = task.dispatches.get()
    assert dispatch.state == DispatchState.DONE
    assert dispatch.claims == 1
    assert dispatch.claimed_by.startswith("worker@")


def test_echo_tasks_sent_one_after_another_are_run_by_one_lingering_job(agent, procs):
    """The quick executors' drain job watches the doorbell and lingers for rings
    (tasks/executors/runner.py): echo tasks sent one after another, each as soon as the one
    before completed, are run by the job that ran the first, not by a job each. The worker's
    drain lasts up to 60 s and lingers up to 5 s (the defaults are 2 s and 0.5 s), so what
    this shows is the hand-off by ring, not how fast a loaded machine sends the next."""
    worker = procs.worker(A2A_DISPATCH_DRAIN_SECONDS="60", A2A_DISPATCH_DRAIN_LINGER_SECONDS="5")
    tasks = []
    for i in range(3):
        tasks.append(wait_state(open_task(agent, f"m{i}"), *TERMINAL_STATES))
    assert [t.task_state for t in tasks] == [S.COMPLETED] * 3
    # A dispatch's claimer is "<worker>:<job id>": one job claimed all three.
    claimers = {dispatch_of(t).claimed_by for t in tasks}
    assert len(claimers) == 1, claimers
    # Its linger over, the job returns how many it ran (and is acknowledged, so stopping the
    # worker kills no job and leaves no bell held for the next test).
    job = claimers.pop().rsplit(":", 1)[1]
    wait_until(
        lambda: f"tasks.run_due_dispatches[{job}] succeeded" in worker.log(),
        timeout=30,
        message="the drain job returned",
    )
    assert re.search(rf"tasks\.run_due_dispatches\[{job}\] succeeded in \S+: 3\b", worker.log())


def test_scripted_chunks_assemble_one_artifact(scripted_agent, procs):
    procs.worker()
    task = wait_state(open_task(scripted_agent, "chunks 3"), *TERMINAL_STATES)

    assert task.task_state == S.COMPLETED
    chunked = task.artifacts.get(artifact_id="chunks-0")
    assert chunked.parts == [{"text": f"chunk {i} of 3"} for i in (1, 2, 3)]
    assert chunked.chunks == 3
    assert chunked.complete
    updates = [
        e.payload["artifactUpdate"]
        for e in TaskEvent.objects.filter(task=task, kind=EventKind.ARTIFACT).order_by("seq")
        if e.payload["artifactUpdate"]["artifact"]["artifactId"] == "chunks-0"
    ]
    assert [(u.get("append", False), u.get("lastChunk", False)) for u in updates] == [
        (False, False),
        (True, False),
        (True, True),
    ]
    assert_events_gap_free(task)


def test_scripted_work_is_re_enqueued_with_an_eta_not_slept(scripted_agent, procs):
    worker = procs.worker()
    task = open_task(scripted_agent, "work 2")

    # The first run leaves the task WORKING and the dispatch pending again, due in ~2 s.
    dispatch = wait_until(
        lambda: ExecutorDispatch.objects.filter(
            task=task, state=DispatchState.PENDING, progress__waited=True
        ).first(),
        timeout=20,
        interval=0.05,
        message="dispatch re-enqueued",
    )
    assert Task.objects.get(pk=task.pk).task_state == S.WORKING
    assert dispatch.not_before > timezone.now() + timedelta(seconds=1)
    assert dispatch.enqueues == 1
    wait_until(lambda: job_results(worker, "again") == 1, timeout=5, message="job returned")

    task = wait_state(task, *TERMINAL_STATES, timeout=20)
    assert task.task_state == S.COMPLETED
    assert statuses(task) == ["submitted", "working", "completed"]
    working_at = TaskEvent.objects.get(task=task, seq=2).created_at
    assert task.status_timestamp - working_at >= timedelta(seconds=2)
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.DONE
    assert dispatch.claims == 2
    # The job commits before Celery logs its result: wait for the line, then count.
    wait_until(lambda: job_results(worker, "done") >= 1, timeout=5, message="job logged")
    assert job_results(worker, "done") == 1


def test_scripted_ask_continues_with_the_next_client_message(scripted_agent, procs):
    procs.worker()
    task = wait_state(open_task(scripted_agent, "ask"), S.INPUT_REQUIRED, *TERMINAL_STATES)
    assert task.task_state == S.INPUT_REQUIRED
    assert status_text(task) == "Please send more input."
    wait_until(lambda: dispatch_of(task).state == DispatchState.DONE, timeout=5)

    services.task_append_message(task_id=task.pk, message=user_message("the answer"))
    task = wait_state(task, *TERMINAL_STATES)

    assert task.task_state == S.COMPLETED
    assert statuses(task) == ["submitted", "working", "input-required", "working", "completed"]
    assert task.artifacts.get(name="echo").parts == [{"text": "the answer"}]
    assert task.dispatches.count() == 2
    assert not task.dispatches.exclude(state=DispatchState.DONE).exists()
    assert_events_gap_free(task)


def test_scripted_outcomes(scripted_agent, procs):
    procs.worker()
    auth = open_task(scripted_agent, "auth")
    fail = open_task(scripted_agent, "fail")
    reject = open_task(scripted_agent, "reject")
    message = open_task(scripted_agent, "message")
    # A working task cannot be rejected: the executor's illegal move fails the task at once.
    late_reject = open_task(scripted_agent, "chunks 1; reject")
    settled = (S.AUTH_REQUIRED, *TERMINAL_STATES)
    auth, fail, reject, message, late_reject = (
        wait_state(t, *settled, timeout=10) for t in (auth, fail, reject, message, late_reject)
    )

    assert auth.task_state == S.AUTH_REQUIRED
    assert status_text(auth) == "Please authenticate."
    assert fail.task_state == S.FAILED
    assert status_text(fail) == "scripted failure"
    assert reject.task_state == S.REJECTED
    assert status_text(reject) == "scripted rejection"
    assert message.task_state == S.COMPLETED
    assert message.answered_with_message
    assert message.messages.filter(role="ROLE_AGENT").get().parts == [{"text": "message"}]
    assert not message.artifacts.exists()
    assert late_reject.task_state == S.FAILED
    assert status_text(late_reject) == "executor error"
    assert statuses(reject) == ["submitted", "rejected"]
    assert statuses(late_reject) == ["submitted", "working", "failed"]
    for task in (auth, fail, reject, message, late_reject):
        assert_events_gap_free(task)
        wait_until(lambda t=task: dispatch_of(t).state == DispatchState.DONE, timeout=5)


def test_cancel_during_work_stops_the_executor_normally(scripted_agent, procs):
    worker = procs.worker()
    task = open_task(scripted_agent, "work 3")
    wait_until(
        lambda: ExecutorDispatch.objects.filter(
            task=task, state=DispatchState.PENDING, progress__waited=True
        ).exists(),
        timeout=20,
        interval=0.05,
    )
    services.task_cancel(task_id=task.pk, reason="changed my mind")
    assert dispatch_of(task).state == DispatchState.DONE

    # The countdown message fires after ~3 s and finds nothing to run.
    wait_until(lambda: job_results(worker, "skipped") == 1, timeout=10, message="late job")
    task.refresh_from_db()
    assert task.task_state == S.CANCELED
    assert statuses(task) == ["submitted", "working", "canceled"]
    dispatch = dispatch_of(task)
    assert dispatch.state == DispatchState.DONE
    assert dispatch.claims == 1
    assert job_results(worker, "failed") == 0
    assert "executor crashed" not in worker.log()


def test_cancel_while_the_executor_runs_stops_it_normally(scripted_agent, procs):
    worker = procs.worker()
    task = open_task(scripted_agent, "chunks 1000")
    wait_until(
        lambda: TaskEvent.objects.filter(task=task, kind=EventKind.ARTIFACT).count() >= 3,
        timeout=20,
        interval=0.02,
    )
    services.task_cancel(task_id=task.pk)

    wait_until(lambda: job_results(worker, "stopped") == 1, timeout=20, message="stopped")
    task.refresh_from_db()
    assert task.task_state == S.CANCELED
    last = TaskEvent.objects.get(task=task, seq=task.last_seq)
    assert last.payload["statusUpdate"]["status"]["state"] == S.CANCELED
    assert task.artifacts.get().chunks < 1000
    assert dispatch_of(task).state == DispatchState.DONE
    assert job_results(worker, "failed") == 0
    assert_events_gap_free(task)


def test_client_answer_racing_the_executor_release_is_not_lost(scripted_agent, procs):
    """The client answers input-required before the executor has released its dispatch.

    Executor and client interleave exactly as in a real race: the executor's INPUT_REQUIRED
    commits, the client's message commits while the dispatch is still claimed, then the
    executor releases. The answer must still be run.
    """
    task = open_task(scripted_agent, "ask")  # no worker yet: the job waits on the broker
    dispatch = dispatch_of(task)
    claim = dispatch_claim(dispatch_id=dispatch.pk, worker="racing-executor")
    assert claim is not None
    services.task_transition(task_id=task.pk, to_state=S.WORKING)
    services.task_transition(task_id=task.pk, to_state=S.INPUT_REQUIRED, message="more?")
    services.task_append_message(task_id=task.pk, message=user_message("quick answer"))
    assert dispatch_finish(dispatch_id=dispatch.pk, worker="racing-executor", progress={"pc": 1})

    procs.worker()
    task = wait_state(task, *TERMINAL_STATES, timeout=20)
    assert task.task_state == S.COMPLETED
    assert task.artifacts.get(name="echo").parts == [{"text": "quick answer"}]
    time.sleep(0.2)
    assert not ExecutorDispatch.objects.filter(
        task=task, state__in=[DispatchState.PENDING, DispatchState.CLAIMED]
    ).exists()
