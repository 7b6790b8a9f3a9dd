"""TaskStore.visible_snapshots (GetTask's read: one statement on PostgreSQL for every request
of a turn) against the three reads it replaces, through both task stores, field by field and
as the wire's Task; several keys in one call each get their own answer."""

import pytest

from tasks import selectors, services, task_store, wire
from tasks.models import Artifact, Message, Task
from tasks.states import TaskState
from tests.factories import task_create, user_message

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
    task = task_create(agent=agent, owner="o", message=user_message("one"))
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


def read(*, agent_id, owner, task_id, history_length):
    key = selectors.snapshot_key(
        agent_id=agent_id, owner=owner, task_id=task_id, history_length=history_length
    )
    return selectors.task_snapshots_for_owner(keys=[key])[0] if key is not None else None


@pytest.mark.parametrize("limit", [None, 0, 1, 2, 3, 10])
def test_it_reads_what_the_three_reads_read(task, limit):
    found = read(agent_id=task.agent_id, owner="o", task_id=str(task.pk), history_length=limit)
    assert found is not None
    check(task, found, limit)


def check(task, found, limit):
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
    task = task_create(agent=agent, owner="o", message=user_message("hi"))
    _, history, artifacts = read(agent_id=agent.pk, owner="o", task_id=task.pk, history_length=None)
    assert artifacts == []
    assert [m.parts for m in history] == [[{"text": "hi"}]]


def test_foreign_unknown_and_malformed_ids_are_none(task):
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


def test_several_keys_in_one_call_each_get_their_own_answer(task, agent):
    # What one turn of the event loop hands the store: GetTasks of different callers, tasks
    # and history lengths, a foreign and an unknown id among them, one task asked twice.
    other = task_create(agent=agent, owner="p", message=user_message("theirs"))
    unknown = "00000000-0000-0000-0000-000000000000"
    asked = [
        (task.agent_id, "o", task.pk, 1),
        (task.agent_id, "p", task.pk, None),  # foreign: "p" does not own it
        (agent.pk, "p", other.pk, None),
        (task.agent_id, "o", unknown, None),
        (task.agent_id, "o", task.pk, None),
        (task.agent_id + 1, "o", task.pk, None),  # another agent's id space
        (task.agent_id, "o", task.pk, 0),
    ]
    keys = [
        selectors.snapshot_key(agent_id=a, owner=o, task_id=t, history_length=n)
        for a, o, t, n in asked
    ]
    found = selectors.task_snapshots_for_owner(keys=keys)
    assert len(found) == len(keys)
    assert [f is None for f in found] == [False, True, False, True, False, True, False]
    check(task, found[0], 1)
    check(task, found[4], None)
    check(task, found[6], 0)
    theirs, history, artifacts = found[2]
    assert theirs.pk == other.pk
    assert theirs.owner == "p"
    assert [m.parts for m in history] == [[{"text": "theirs"}]]
    assert artifacts == []


def test_no_keys_read_nothing():
    assert selectors.task_snapshots_for_owner(keys=[]) == []


def test_a_malformed_id_has_no_key():
    key = selectors.snapshot_key(agent_id=1, owner="o", task_id="not-a-uuid", history_length=1)
    assert key is None
