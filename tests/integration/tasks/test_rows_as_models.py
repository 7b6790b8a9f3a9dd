"""Rows the PostgreSQL task store reads by hand (a2a_platform/lib/sql.py, built without
`Model.__init__`) are the instances Django's own queries load: same values, saved as an
UPDATE, related rows fetched on access; and once a `post_init` receiver is connected, it
sees them as it sees the ORM's."""

import pytest
from django.db import connection
from django.db.models import signals
from django.test.utils import CaptureQueriesContext

from tasks import selectors, services
from tasks.models import Artifact, Message, Task
from tasks.states import TaskState
from tasks.task_store import get_task_store
from tests.factories import user_message

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def postgres_store(settings):
    settings.A2A_STORE = "postgres"


@pytest.fixture
def task(agent) -> Task:
    task = services.task_create(agent=agent, owner="o", message=user_message("one"))
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
