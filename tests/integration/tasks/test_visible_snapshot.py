"""TaskStore.visible_snapshot (GetTask's read: one statement on PostgreSQL) against the three
reads it replaces, through both task stores, field by field and as the wire's Task."""

import pytest

from tasks import selectors, services, task_store, wire
from tasks.models import Artifact, Message, Task
from tasks.states import TaskState
from tests.factories import user_message

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True, params=["postgres", "orm"])
def store(request, settings):
    settings.A2A_STORE = request.param
    expected = {"postgres": task_store.PgTaskStore, "orm": task_store.OrmTaskStore}
    assert type(task_store.get_task_store()) is expected[request.param]
    return request.param


def values(obj) -> tuple:
    return tuple(getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields)


@pytest.fixture
def task(agent) -> Task:
    task = services.task_create(agent=agent, owner="o", message=user_message("one"))
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    services.task_add_artifact(
        task_id=task.pk,
        artifact={"artifactId": "a", "name": "first", "parts": [{"text": "x"}]},
        last_chunk=True,
    )
    services.task_add_artifact(
        task_id=task.pk,
        artifact={
            "artifactId": "b",
            "parts": [{"data": {"k": [1, 2.5, None]}}],
            "metadata": {"m": "ü"},
        },
    )
    services.task_transition(task_id=task.pk, to_state=TaskState.INPUT_REQUIRED, message="?")
    services.task_append_message(task_id=task.pk, message=user_message("two"))
    services.task_append_message(task_id=task.pk, message=user_message("three"))
    return Task.objects.get(pk=task.pk)


@pytest.mark.parametrize("limit", [None, 0, 1, 2, 3, 10])
def test_it_reads_what_the_three_reads_read(task, limit):
    found = selectors.task_snapshot_for_owner(
        agent_id=task.agent_id, owner="o", task_id=str(task.pk), history_length=limit
    )
    assert found is not None
    got_task, history, artifacts = found
    assert values(got_task) == values(task)
    expected_history = selectors.task_history(task, limit) if limit != 0 else []
    assert [values(m) for m in history] == [values(m) for m in expected_history]
    assert len(history) == (3 if limit is None else min(limit, 3))
    assert all(m.task is got_task for m in history)
    assert [values(a) for a in artifacts] == [values(a) for a in selectors.task_artifacts(task)]
    assert [a.artifact_id for a in artifacts] == ["a", "b"]
    assert all(isinstance(x, Message) for x in history)
    assert all(isinstance(x, Artifact) for x in artifacts)
    assert wire.task_json(got_task, history=history, artifacts=artifacts) == wire.task_json(
        task, history=expected_history, artifacts=selectors.task_artifacts(task)
    )


def test_a_task_without_artifacts_has_none(agent):
    task = services.task_create(agent=agent, owner="o", message=user_message("hi"))
    _, history, artifacts = selectors.task_snapshot_for_owner(
        agent_id=agent.pk, owner="o", task_id=task.pk, history_length=None
    )
    assert artifacts == []
    assert [m.parts for m in history] == [[{"text": "hi"}]]


def test_foreign_unknown_and_malformed_ids_are_none(task):
    read = selectors.task_snapshot_for_owner
    assert read(agent_id=task.agent_id, owner="other", task_id=task.pk, history_length=None) is None
    assert read(agent_id=task.agent_id + 1, owner="o", task_id=task.pk, history_length=None) is None
    assert (
        read(
            agent_id=task.agent_id,
            owner="o",
            task_id="00000000-0000-0000-0000-000000000000",
            history_length=None,
        )
        is None
    )
    assert read(agent_id=task.agent_id, owner="o", task_id="not-a-uuid", history_length=1) is None
