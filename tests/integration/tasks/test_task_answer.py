"""services.task_answer, the echo executor's whole answer in one transaction, through both
task stores: the same events as three services in turn, all of them or none."""

import pytest

from tasks import services, task_store
from tasks.errors import TaskTerminal
from tasks.models import EventKind, Task, TaskEvent
from tasks.state_machine import IllegalTransition
from tasks.states import TaskState
from tests.factories import task_create, user_message
from tests.statements import statements, task_locks

pytestmark = pytest.mark.django_db

S = TaskState
ECHO = {"artifactId": "echo", "name": "echo", "parts": [{"text": "hi"}]}


@pytest.fixture(autouse=True, params=["postgres", "orm"])
def store(request, settings):
    settings.A2A_STORE = request.param
    expected = {"postgres": task_store.PgTaskStore, "orm": task_store.OrmTaskStore}
    assert type(task_store.get_task_store()) is expected[request.param]
    return request.param


def open_task(agent) -> Task:
    return task_create(agent=agent, owner="o", message=user_message("hi"))


def events(task: Task) -> list[tuple[int, str, str]]:
    """(seq, kind, state, artifactId or role) of each event, oldest first."""
    rows = []
    for e in TaskEvent.objects.filter(task=task).order_by("seq"):
        if e.kind == EventKind.STATUS:
            rows.append((e.seq, e.kind, e.payload["statusUpdate"]["status"]["state"]))
        elif e.kind == EventKind.MESSAGE:
            rows.append((e.seq, e.kind, e.payload["message"]["role"]))
        else:
            rows.append((e.seq, e.kind, e.payload["artifactUpdate"]["artifact"]["artifactId"]))
    return rows


def test_a_submitted_task_goes_working_artifact_completed(agent):
    task = open_task(agent)
    answered = services.task_answer(task_id=task.pk, artifact=ECHO)
    assert answered.task_state == S.COMPLETED
    assert events(task) == [
        (1, "status", S.SUBMITTED.value),
        (2, "status", S.WORKING.value),
        (3, "artifact", "echo"),
        (4, "status", S.COMPLETED.value),
    ]
    artifact = task.artifacts.get()
    assert (artifact.name, artifact.parts, artifact.complete) == ("echo", [{"text": "hi"}], True)
    assert artifact.chunks == 1
    task.refresh_from_db()
    assert task.last_seq == 4
    assert not task.dispatches.filter(state__in=["pending", "claimed"]).exists()


def test_a_resumed_run_does_not_send_a_committed_artifact_again(agent):
    task = open_task(agent)
    services.task_transition(task_id=task.pk, to_state=S.WORKING)
    services.task_add_artifact(task_id=task.pk, artifact=ECHO, last_chunk=True)
    services.task_answer(task_id=task.pk, artifact=ECHO)
    assert [kind for _, kind, _ in events(task)] == ["status", "status", "artifact", "status"]
    assert events(task)[-1] == (4, "status", S.COMPLETED.value)


def test_a_working_task_without_the_artifact_gets_it_then_completes(agent):
    task = open_task(agent)
    services.task_transition(task_id=task.pk, to_state=S.WORKING)
    services.task_answer(task_id=task.pk, artifact=ECHO, message="done")
    assert events(task)[1:] == [
        (2, "status", S.WORKING.value),
        (3, "artifact", "echo"),
        (4, "status", S.COMPLETED.value),
    ]
    task.refresh_from_db()
    assert task.status_message["parts"] == [{"text": "done"}]


def test_an_incomplete_artifact_of_that_id_is_replaced(agent):
    task = open_task(agent)
    services.task_transition(task_id=task.pk, to_state=S.WORKING)
    services.task_add_artifact(task_id=task.pk, artifact={**ECHO, "parts": [{"text": "h"}]})
    services.task_answer(task_id=task.pk, artifact=ECHO)
    artifact = task.artifacts.get()
    assert (artifact.parts, artifact.complete, artifact.chunks) == ([{"text": "hi"}], True, 1)


def test_a_terminal_task_raises_and_changes_nothing(agent):
    task = open_task(agent)
    services.task_cancel(task_id=task.pk)
    with pytest.raises(TaskTerminal):
        services.task_answer(task_id=task.pk, artifact=ECHO)
    assert len(events(task)) == 2
    assert not task.artifacts.exists()


def test_a_refused_final_state_rolls_back_the_whole_answer(agent):
    task = open_task(agent)
    with pytest.raises(IllegalTransition):
        services.task_answer(task_id=task.pk, artifact=ECHO, to_state=S.SUBMITTED)
    task.refresh_from_db()
    assert task.task_state == S.SUBMITTED
    assert task.last_seq == 1
    assert events(task) == [(1, "status", S.SUBMITTED.value)]
    assert not task.artifacts.exists()


# --- An answer built from the claim's row (`seen`), without the lock first ------------------


def test_an_answer_from_an_unmoved_claim_row_takes_no_lock_and_writes_the_same(agent):
    locked, optimistic = open_task(agent), open_task(agent)
    seen = Task.objects.get(pk=optimistic.pk)  # as a quick claim reads it
    with statements() as ran_locked:
        services.task_answer(task_id=locked.pk, artifact=ECHO, message="done")
    with statements() as ran:
        answered = services.task_answer(
            task_id=optimistic.pk, artifact=ECHO, message="done", seen=seen
        )
    assert (task_locks(ran_locked), task_locks(ran)) == (1, 0)
    assert len(ran) == len(ran_locked) - 1
    assert events(optimistic) == events(locked)
    assert answered.task_state == S.COMPLETED
    stored = Task.objects.get(pk=optimistic.pk)
    assert (stored.task_state, stored.last_seq, stored.status_message["parts"]) == (
        S.COMPLETED,
        4,
        [{"text": "done"}],
    )
    assert optimistic.artifacts.get().parts == [{"text": "hi"}]
    assert not optimistic.dispatches.filter(state__in=["pending", "claimed"]).exists()


def test_an_answer_from_a_row_that_moved_is_built_again_under_the_lock(agent):
    task = open_task(agent)
    seen = Task.objects.get(pk=task.pk)
    services.task_append_message(task_id=task.pk, message=user_message("more"))  # seq 2
    with statements() as ran:
        services.task_answer(task_id=task.pk, artifact=ECHO, seen=seen)
    assert task_locks(ran) == 1
    assert events(task)[1:] == [
        (2, "message", "ROLE_USER"),
        (3, "status", S.WORKING.value),
        (4, "artifact", "echo"),
        (5, "status", S.COMPLETED.value),
    ]
    assert Task.objects.get(pk=task.pk).last_seq == 5


def test_an_answer_from_a_row_read_before_a_cancel_raises_and_writes_nothing(agent):
    task = open_task(agent)
    seen = Task.objects.get(pk=task.pk)
    services.task_cancel(task_id=task.pk)
    with pytest.raises(TaskTerminal):
        services.task_answer(task_id=task.pk, artifact=ECHO, seen=seen)
    assert events(task) == [(1, "status", S.SUBMITTED.value), (2, "status", S.CANCELED.value)]
    assert not task.artifacts.exists()


def test_a_refusal_read_from_the_claim_row_is_decided_under_the_lock(agent):
    """The stale row would refuse the move (WORKING cannot go back to SUBMITTED); the task
    as it is now was canceled meanwhile, and that is the answer the executor gets."""
    task = open_task(agent)
    seen = Task.objects.get(pk=task.pk)
    services.task_cancel(task_id=task.pk)
    with pytest.raises(TaskTerminal):
        services.task_answer(task_id=task.pk, artifact=ECHO, to_state=S.SUBMITTED, seen=seen)
    assert len(events(task)) == 2
