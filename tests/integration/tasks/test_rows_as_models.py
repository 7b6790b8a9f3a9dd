"""Rows the PostgreSQL task store reads by hand (a2a_platform/lib/sql.py, built without
`Model.__init__`) are the instances Django's own queries load: same values, saved as an
UPDATE, related rows fetched on access; and once a `post_init` receiver is connected, it
sees them as it sees the ORM's. New rows built by `sql.new_row` are the instances the
constructor builds."""

import uuid

import pytest
from django.db import connection
from django.db.models import signals
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule

from a2a_platform.lib.sql import new_row
from agents.models import Agent
from tasks import selectors, services
from tasks.models import Artifact, ExecutorDispatch, Message, MessageReceipt, Task, TaskEvent
from tasks.states import TaskState
from tasks.task_store import get_task_store
from tests.factories import task_create, user_message

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def postgres_store(settings):
    settings.A2A_STORE = "postgres"


@pytest.fixture
def task(agent) -> Task:
    task = task_create(agent=agent, owner="o", message=user_message("one"))
    services.task_add_artifact(
        task_id=task.pk, artifact={"artifactId": "a", "parts": [{"text": "x"}]}, last_chunk=True
    )
    # JSON the store reads back as text: an integer no double holds, floats, text to escape.
    metadata = {"big": 2**70 + 1, "f": [0.1, -0.0, 1e300], "text": 'ü\u2028"\\\x01'}
    Message.objects.create(
        task=task, message_id="m2", role="ROLE_AGENT", parts=[{"data": metadata}], metadata=metadata
    )
    return task


def snapshot(task: Task):
    key = selectors.snapshot_key(
        agent_id=task.agent_id, owner="o", task_id=task.pk, history_length=None
    )
    return selectors.task_snapshots_for_owner(keys=[key])[0]


def fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_a_snapshots_rows_are_what_the_orm_loads_and_save_as_updates(task):
    read, history, artifacts = snapshot(task)
    rows = [read, *history, *artifacts]
    assert [type(row) for row in rows] == [Task, Message, Message, Artifact]
    for row in rows:
        loaded = type(row).objects.get(pk=row.pk)
        assert fields(row) == fields(loaded)
        assert (row._state.adding, row._state.db) == (False, loaded._state.db)
        assert row == loaded
    assert history[0].task is read  # the snapshot's own task, not a query
    with CaptureQueriesContext(connection) as queries:
        assert artifacts[0].task.pk == task.pk  # fetched on access, as the ORM's rows
        read.state = TaskState.WORKING.value
        read.save()  # a row Django thinks is new would be inserted (its id has a default)
    assert [q["sql"].split()[0] for q in queries] == ["SELECT", "UPDATE"]
    assert Task.objects.get(pk=task.pk).state == TaskState.WORKING.value


def test_a_post_init_receiver_sees_the_stores_rows_as_it_sees_the_orms(task):
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append((sender, instance.pk))

    signals.post_init.connect(receiver)
    try:
        read, history, artifacts = snapshot(task)
        locked = get_task_store().lock(task.pk)
    finally:
        signals.post_init.disconnect(receiver)
    assert (Task, task.pk) in seen
    assert (Message, history[0].pk) in seen
    assert (Artifact, artifacts[0].pk) in seen
    assert seen.count((Task, task.pk)) == 2  # the snapshot's task and the locked one
    assert locked.agent.pk == task.agent_id


def _new_rows(agent, task_pk, now, make) -> list:
    """The hot path's new rows (services._new_task, _append_event, the receipts, an
    artifact), each built by `make(model, **values)`: plain values, a foreign key by name
    (an object, new or saved) and by attname, fields left to their defaults."""
    agent = Agent.objects.get(pk=agent.pk)  # a fresh instance for each build: its _state moves
    new = make(
        Task,
        id=task_pk,
        agent=agent,
        owner="o",
        context_id="c",
        state="TASK_STATE_SUBMITTED",
        status_timestamp=now,
        metadata={"k": [1]},
        last_seq=1,
        card_version_id=None,
    )
    return [
        new,
        make(Message, task=new, message_id="m", role="ROLE_USER", parts=[{"text": "t"}]),
        make(TaskEvent, task=new, seq=1, kind="status", payload={}, created_at=now),
        make(ExecutorDispatch, task=new, not_before=now, progress={}, enqueues=1),
        make(
            MessageReceipt, agent=agent, owner="o", message_id="m", request_hash="h", task_id=new.pk
        ),
        make(Artifact, task=new, artifact_id="a"),
    ]


def test_new_rows_are_what_the_constructor_builds_and_insert_alike(agent):
    task_pk, now = uuid.uuid4(), timezone.now()
    theirs = _new_rows(agent, task_pk, now, lambda model, **values: model(**values))
    ours = _new_rows(agent, task_pk, now, new_row)
    for mine, django in zip(ours, theirs, strict=True):
        assert type(mine) is type(django)
        assert fields(mine) == fields(django)
        assert (mine._state.adding, mine._state.db) == (django._state.adding, django._state.db)
        cached = mine._state.fields_cache
        assert {k: type(v) for k, v in cached.items()} == {
            k: type(v) for k, v in django._state.fields_cache.items()
        }
    assert ours[1].task is ours[0]  # the related object itself, no query
    assert ours[0]._state.db == theirs[0]._state.db == connection.alias  # set by the key
    # And they insert (the ORM store's way on SQLite) and read back as built.
    for row in ours:
        row.save(force_insert=True)
        assert fields(type(row).objects.get(pk=row.pk)) == fields(row)


def test_new_row_refuses_what_the_constructor_refuses(agent):
    with pytest.raises(TypeError, match="no field named colour"):
        new_row(Task, agent=agent, colour="red")
    with pytest.raises(ValueError, match='must be a "Task" instance'):  # Django's own check
        new_row(Message, task=agent)
    # A field with a descriptor of its own (django-timezone-field's): not built by hand.
    with pytest.raises(TypeError, match="cannot build CrontabSchedule.timezone"):
        new_row(CrontabSchedule)
