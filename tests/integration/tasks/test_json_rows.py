"""Rows the PostgreSQL task store writes as one JSON parameter per model (a2a_platform/lib/sql.py
`json_rows`) read back as the rows the ORM's own save writes from the same values (the ORM
store, `A2A_STORE=orm`, on the same database is the oracle): JSON of any shape (integers past
64 bits, floats, text to escape), timestamps to the microsecond, UUIDs, NULLs; new tasks
(`open_tasks`) and an answer's events and artifact (`append_events`)."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from a2a_platform.lib.sql import json_rows
from tasks.models import Artifact, EventKind, ExecutorDispatch, Message, Task, TaskEvent
from tasks.states import TaskState
from tasks.task_store import NewTask, get_task_store
from webhooks.models import DeliveryAttempt

pytestmark = pytest.mark.django_db

# Text with what JSON escapes or UTF-8 spells in several bytes (explicit: no Unicode database
# to build on a fresh machine). PostgreSQL stores no NUL in text or jsonb, however written.
TEXT = st.text(alphabet='aZ é"\\/\n\t\x01\x7f\u2028\ufeff😀', max_size=6)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
OBJECTS = st.dictionaries(TEXT, JSON, max_size=4)
# Any microsecond of a wide range, in UTC (what the platform stores).
STAMPS = st.datetimes(
    min_value=datetime(1970, 1, 1),  # noqa: DTZ001 (hypothesis bounds are naive)
    max_value=datetime(2200, 1, 1),  # noqa: DTZ001
    timezones=st.just(UTC),
)
RELAXED = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# What differs between two writes of the same values: the keys, and the stamps `save()` takes.
OWN = {"id", "task_id", "created_at", "updated_at"}


def shape(value):
    """The value, its numbers tagged with their type: an integer read back as a float (or the
    reverse) is a difference, though Python finds 1 == 1.0."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    if isinstance(value, bool | int | float):
        return (type(value).__name__, value)
    return value


def fields(obj) -> dict:
    return {f.attname: shape(getattr(obj, f.attname)) for f in type(obj)._meta.concrete_fields}


def read_back(obj):
    return fields(type(obj).objects.get(pk=obj.pk))


def assert_written_alike(ours, theirs) -> None:
    """`ours` (written by the PostgreSQL store) reads back as `theirs` (the ORM's) in every
    column but its own keys and stamps, which read back as the object holds them."""
    for mine, oracle in zip(ours, theirs, strict=True):
        read, expected, held = read_back(mine), read_back(oracle), fields(mine)
        for name, value in read.items():
            assert value == (held[name] if name in OWN else expected[name]), name


def store(settings, choice: str):
    settings.A2A_STORE = choice
    return get_task_store()


def new_task(agent, *, metadata, parts, stamp, context, message_id="m", refs=()) -> NewTask:
    task = Task(
        id=uuid.uuid4(),
        agent=agent,
        owner="o",
        context_id=context,
        state=TaskState.SUBMITTED.value,
        status_timestamp=stamp,
        metadata=metadata,
        last_seq=1,
    )
    message = Message(
        task=task,
        message_id=message_id,
        role="ROLE_USER",
        parts=parts,
        metadata=metadata,
        reference_task_ids=list(refs),
    )
    event = TaskEvent(task=task, seq=1, kind=EventKind.STATUS, payload=parts, created_at=stamp)
    dispatch = ExecutorDispatch(task=task, not_before=stamp, progress=metadata, enqueues=1)
    return NewTask(task, message, event, dispatch)


def rows(new: NewTask) -> tuple:
    return (new.task, new.message, new.event, new.dispatch)


@RELAXED
@given(metadata=OBJECTS, data=JSON, stamp=STAMPS, context=TEXT)
def test_a_new_tasks_rows_read_back_as_the_orms(settings, agent, metadata, data, stamp, context):
    refs = [str(uuid.uuid4())]
    made = [
        new_task(
            agent,
            metadata=metadata,
            parts=[{"data": data}],
            stamp=stamp,
            context=context,
            message_id=context,
            refs=refs,
        )
        for _ in range(2)
    ]
    assert store(settings, "postgres").open_tasks(made[:1]) == [True]
    assert store(settings, "orm").open_tasks(made[1:]) == [True]
    assert_written_alike(rows(made[0]), rows(made[1]))


def test_an_integer_no_double_holds_and_a_null_json_column_read_back_exactly(settings, agent):
    big = 2**70 + 1
    stamp = datetime(2026, 12, 4, 23, 59, 59, 999999, tzinfo=UTC)
    new = new_task(agent, metadata={"big": big}, parts=[{"data": [big]}], stamp=stamp, context="c")
    new.task.status_message = None
    store(settings, "postgres").open_tasks([new])
    task = Task.objects.get(pk=new.task.pk)
    assert task.metadata == {"big": big}
    assert type(task.metadata["big"]) is int
    assert task.status_message is None
    assert task.status_timestamp == stamp
    assert Message.objects.get(pk=new.message.pk).parts == [{"data": [big]}]


PAYLOADS = st.lists(JSON.filter(lambda value: value is not None), min_size=1, max_size=3)


@RELAXED
@given(payloads=PAYLOADS, metadata=OBJECTS, stamp=STAMPS)
def test_an_answers_events_and_artifact_read_back_as_the_orms(
    settings, agent, payloads, metadata, stamp
):
    written = []
    for choice in ("postgres", "orm"):
        new = new_task(agent, metadata={}, parts=[{"text": "x"}], stamp=stamp, context="c")
        store(settings, choice).open_tasks([new])
        task = new.task
        events = [
            TaskEvent(task=task, seq=seq, kind=EventKind.ARTIFACT, payload=body, created_at=stamp)
            for seq, body in enumerate(payloads, start=2)
        ]
        artifact = Artifact(
            task=task, artifact_id="a", name="n", parts=[{"data": metadata}], metadata=metadata
        )
        task.state = TaskState.COMPLETED.value
        task.status_timestamp = stamp + timedelta(microseconds=1)
        task.last_seq = events[-1].seq
        with transaction.atomic():  # the ORM store writes inside the caller's transaction
            assert store(settings, choice).append_events(task, events, artifact)
        written.append((task, *events, artifact))
    assert_written_alike(*written)
    ours = written[0][0]
    assert list(TaskEvent.objects.filter(task=ours).order_by("id").values_list("seq", flat=True))[
        1:
    ] == [event.seq for event in written[0][1:-1]]


def test_a_model_whose_saved_value_is_not_its_json_is_refused():
    # A float column: JSON would carry a NaN as null (orjson) or as text PostgreSQL refuses.
    with pytest.raises(TypeError, match="DeliveryAttempt.duration_ms"):
        json_rows(DeliveryAttempt, [])
