"""services.task_answer, the echo executor's whole answer in one transaction, through both
task stores: the same events as three services in turn, all of them or none."""

import pytest

from tasks import services, task_store
from tasks.errors import TaskTerminal
from tasks.models import EventKind, Task, TaskEvent
from tasks.state_machine import IllegalTransition
from tasks.states import TaskState
from tests.factories import user_message

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
    return services.task_create(agent=agent, owner="o", message=user_message("hi"))


def events(task: Task) -> list[tuple[int, str, str]]:
    """(seq, kind, state or artifactId) of each event, oldest first."""
    rows = []
    for e in TaskEvent.objects.filter(task=task).order_by("seq"):
        if e.kind == EventKind.STATUS:
            rows.append((e.seq, e.kind, e.payload["statusUpdate"]["status"]["state"]))
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
