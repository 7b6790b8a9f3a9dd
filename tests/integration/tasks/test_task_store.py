"""The task store contract: each TaskStore method, called on both implementations against
PostgreSQL, leaves the same rows and returns the same values (as Django runs one test suite per
database backend).

Each scenario runs once per store in a transaction rolled back afterwards, with the clock frozen
and the task's id fixed, so the two runs write identical rows; database-generated ids (the
sequences move on between the runs) are left out of the comparison, and each scenario checks
instead that the objects carry the ids their rows got.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import models, transaction

from tasks.models import (
    Artifact,
    DispatchState,
    ExecutorDispatch,
    Message,
    MessageReceipt,
    Task,
    TaskEvent,
)
from tasks.states import TaskState
from tasks.task_store import (
    NewTask,
    OrmTaskStore,
    PgTaskStore,
    SettledKey,
    SnapshotKey,
    TaskStore,
    get_task_store,
)
from tests.factories import AgentFactory, task_create

pytestmark = pytest.mark.django_db

T0 = datetime(2031, 5, 4, 12, 0, 0, tzinfo=UTC)
TASK_PK = uuid.UUID("00000000-0000-4000-8000-000000000001")
STORES: dict[str, TaskStore] = {"postgres": PgTaskStore(), "orm": OrmTaskStore()}
ROW_MODELS = (Task, Message, Artifact, TaskEvent, ExecutorDispatch, MessageReceipt)


class _Rollback(Exception):
    pass


def _fields(obj: models.Model) -> dict[str, Any]:
    """A row's values by attname, without a database-generated id."""
    return {
        f.attname: getattr(obj, f.attname)
        for f in obj._meta.concrete_fields
        if not isinstance(f, models.AutoField)
    }


def _rows() -> dict[str, list[dict[str, Any]]]:
    out = {}
    for model in ROW_MODELS:
        rows = [_fields(obj) for obj in model.objects.order_by("pk")]
        out[model.__name__] = sorted(rows, key=repr)
    return out


def _value(value: Any) -> Any:
    """A return value in comparable form (model instances by their fields)."""
    if isinstance(value, models.Model):
        return (type(value).__name__, _fields(value))
    if isinstance(value, list | tuple):
        return [_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _value(v) for k, v in value.items()}
    return value


def both(scenario: Callable[[TaskStore], Any]) -> Any:
    """Run `scenario` on each store; assert equal return values and rows; return them."""
    seen = {}
    for name, store in STORES.items():
        with contextlib.suppress(_Rollback), transaction.atomic():
            seen[name] = {"value": _value(scenario(store)), "rows": _rows()}
            raise _Rollback
    assert seen["postgres"] == seen["orm"]
    return seen["postgres"]


@pytest.fixture(autouse=True)
def frozen(time_machine):
    time_machine.move_to(T0, tick=False)
    return time_machine


def _open(store: TaskStore, agent, *, pk: uuid.UUID = TASK_PK, owner: str = "o") -> Task:
    task = Task(
        id=pk,
        agent=agent,
        owner=owner,
        context_id="ctx",
        state=TaskState.SUBMITTED.value,
        status_timestamp=T0,
        metadata={"m": 1},
        last_seq=1,
    )
    message = Message(
        task=task, message_id="m1", role="ROLE_USER", parts=[{"text": "hi"}], metadata={}
    )
    event = TaskEvent(task=task, seq=1, kind="status", payload={"s": 1}, created_at=T0)
    dispatch = ExecutorDispatch(task=task, not_before=T0, progress={}, enqueues=1)
    assert store.open_tasks([NewTask(task, message, event, dispatch)]) == [True]
    return task


def _new_task_rows(
    agent, pk: uuid.UUID = TASK_PK, *, progress=None, message_id: str = "m1"
) -> NewTask:
    """A new task's four rows as open_tasks takes them (nothing saved): the task, its first
    message, its first event and its dispatch (`progress` None: one that cannot be written)."""
    task = Task(
        id=pk,
        agent=agent,
        owner="o",
        context_id="ctx",
        state=TaskState.SUBMITTED.value,
        status_timestamp=T0,
        last_seq=1,
    )
    return NewTask(
        task,
        Message(task=task, message_id=message_id, role="ROLE_USER", parts=[{"text": "hi"}]),
        TaskEvent(task=task, seq=1, kind="status", payload={"s": 1}, created_at=T0),
        ExecutorDispatch(task=task, not_before=T0, progress=progress, enqueues=1),
    )


def _receipt(agent, new: NewTask, request_hash: str = "h") -> NewTask:
    """`new` with an idempotency receipt for its message."""
    receipt = MessageReceipt(
        agent=agent,
        owner=new.task.owner,
        message_id=new.message.message_id,
        request_hash=request_hash,
        task_id=new.task.pk,
    )
    return replace(new, receipt=receipt)


def _message(task: Task, message_id: str) -> Message:
    message = Message(
        task=task, message_id=message_id, role="ROLE_AGENT", parts=[{"text": message_id}]
    )
    message.save(force_insert=True)
    return message


def test_open_task_writes_the_four_rows_and_gives_each_its_id(agent):
    def scenario(store):
        new = _new_task_rows(agent, progress={"p": 1})
        task, rows = new.task, (new.message, new.event, new.dispatch)
        (result,) = store.open_tasks([new])
        ids_match = [type(r).objects.get(task=task).pk == r.pk for r in rows]
        saved = [r._state.adding for r in (task, *rows)]
        return result, task, *rows, ids_match, saved

    seen = both(scenario)
    assert seen["value"][-2:] == [[True, True, True], [False, False, False, False]]
    assert {name: len(rows) for name, rows in seen["rows"].items()} == {
        "Task": 1,
        "Message": 1,
        "Artifact": 0,
        "TaskEvent": 1,
        "ExecutorDispatch": 1,
        "MessageReceipt": 0,
    }


def test_open_task_with_a_receipt_writes_nothing_when_the_receipt_is_taken(agent):
    def scenario(store):
        def attempt(pk: uuid.UUID, request_hash: str):
            new = _receipt(agent, _new_task_rows(agent, pk, progress={}), request_hash)
            (opened,) = store.open_tasks([new])
            rows = (new.message, new.event, new.dispatch)
            return opened, new.receipt.pk is not None, [r._state.adding for r in rows]

        first = attempt(TASK_PK, "h")
        # A retry of the same messageId (another body, too): refused, and the caller's
        # transaction goes on.
        retry = attempt(uuid.UUID(int=2), "h2")
        return first, retry, MessageReceipt.objects.get().task_id == TASK_PK

    seen = both(scenario)
    assert seen["value"] == [
        [True, True, [False, False, False]],
        [False, False, [True, True, True]],
        True,
    ]
    assert {name: len(rows) for name, rows in seen["rows"].items()} == {
        "Task": 1,
        "Message": 1,
        "Artifact": 0,
        "TaskEvent": 1,
        "ExecutorDispatch": 1,
        "MessageReceipt": 1,
    }
    assert seen["rows"]["MessageReceipt"][0]["request_hash"] == "h"


def test_claim_receipt_inserts_once_then_refuses_the_retry(agent):
    def scenario(store):
        _open(store, agent)
        first = MessageReceipt(
            agent=agent, owner="o", message_id="m1", request_hash="h", task_id=TASK_PK
        )
        claimed = store.claim_receipt(first)
        retry = MessageReceipt(
            agent=agent, owner="o", message_id="m1", request_hash="h2", task_id=TASK_PK
        )
        claimed_again = store.claim_receipt(retry)
        # The caller's transaction goes on after a refused claim.
        other = MessageReceipt(
            agent=agent, owner="p", message_id="m1", request_hash="h", task_id=TASK_PK
        )
        return (
            claimed,
            claimed_again,
            store.claim_receipt(other),
            MessageReceipt.objects.get(owner="o").pk == first.pk,
            retry.pk,
        )

    seen = both(scenario)
    assert seen["value"] == [True, False, True, True, None]
    assert [r["request_hash"] for r in seen["rows"]["MessageReceipt"]] == ["h", "h"]


def test_lock_returns_the_task_with_its_agent_or_none(agent):
    def scenario(store):
        _open(store, agent)
        task = store.lock(TASK_PK)
        return task, _fields(task.agent), task._state.adding, store.lock(uuid.uuid4())

    seen = both(scenario)
    assert seen["value"][1]["slug"] == agent.slug
    assert seen["value"][2:] == [False, None]


def test_visible_only_to_the_tasks_agent_and_owner(agent):
    other_agent = AgentFactory()

    def scenario(store):
        _open(store, agent)
        return (
            store.visible(agent.pk, "o", TASK_PK),
            store.visible(agent.pk, "someone else", TASK_PK),
            store.visible(other_agent.pk, "o", TASK_PK),
            store.visible(agent.pk, "o", uuid.uuid4()),
        )

    seen = both(scenario)
    assert seen["value"][0][1]["id"] == TASK_PK
    assert seen["value"][1:] == [None, None, None]


def test_history_oldest_first_all_or_the_newest_n(agent):
    def scenario(store):
        task = _open(store, agent)
        _message(task, "m2")
        _message(task, "m3")
        got = {n: store.history(task, n) for n in (None, 0, 2, 10)}
        same_task = all(m.task is task for messages in got.values() for m in messages)
        return {n: [m.message_id for m in ms] for n, ms in got.items()}, got[None], same_task

    seen = both(scenario)
    ids, _, same_task = seen["value"]
    assert ids == {None: ["m1", "m2", "m3"], 0: [], 2: ["m2", "m3"], 10: ["m1", "m2", "m3"]}
    assert same_task


def test_append_events_saves_the_artifact_inserted_then_replaced_in_place(agent, frozen):
    def scenario(store):
        task = _open(store, agent)

        def save_artifact(artifact: Artifact) -> None:
            task.last_seq += 1
            event = TaskEvent(task=task, seq=task.last_seq, kind="artifact", payload={})
            event.created_at = T0
            return store.append_events(task, [event], artifact)

        first = Artifact(task=task, artifact_id="a", name="one", parts=[{"text": "1"}])
        inserted = save_artifact(first)
        first_pk = first.pk
        missing = store.artifact(task, "nope")
        frozen.move_to(T0 + timedelta(seconds=5), tick=False)
        existing = store.artifact(task, "a")
        existing.parts = existing.parts + [{"text": "2"}]
        existing.chunks += 1
        existing.complete = True
        save_artifact(existing)
        second = Artifact(task=task, artifact_id="b", parts=[{"text": "b"}])
        save_artifact(second)
        frozen.move_to(T0, tick=False)
        listed = store.artifacts(task)
        return (
            inserted,
            missing,
            existing.pk == first_pk,
            existing.created_at,
            store.artifact(task, "a"),
            [a.artifact_id for a in listed],
            [a.pk for a in listed] == sorted(a.pk for a in listed),
        )

    seen = both(scenario)
    inserted, missing, kept_pk, created_at, stored, order, by_id = seen["value"]
    assert (inserted, missing, kept_pk, created_at) == (True, None, True, T0)
    assert stored[1]["parts"] == [{"text": "1"}, {"text": "2"}]
    assert stored[1]["updated_at"] == T0 + timedelta(seconds=5)
    assert (order, by_id) == (["a", "b"], True)
    # Each save came with its event, in the same write.
    assert [e["seq"] for e in seen["rows"]["TaskEvent"]] == [1, 2, 3, 4]


def test_append_events_writes_the_events_and_the_tasks_lifecycle_fields_once(agent, frozen):
    def scenario(store):
        task = store.lock(_open(store, agent).pk)
        frozen.move_to(T0 + timedelta(seconds=3), tick=False)
        task.state = TaskState.COMPLETED.value
        task.status_timestamp = T0 + timedelta(seconds=2)
        task.status_message = {"role": "ROLE_AGENT"}
        task.last_seq = 3
        task.metadata = {"not": "a lifecycle field"}  # must not be written
        events = [
            TaskEvent(task=task, seq=2, kind="status", payload={"s": 2}, created_at=T0),
            TaskEvent(task=task, seq=3, kind="status", payload={"s": 3}, created_at=T0),
        ]
        result = store.append_events(task, events)
        frozen.move_to(T0, tick=False)
        stored = {e.seq: e.pk for e in TaskEvent.objects.filter(seq__gt=1)}
        return result, [e.pk for e in events] == [stored[2], stored[3]], task.updated_at

    seen = both(scenario)
    assert seen["value"] == [True, True, T0 + timedelta(seconds=3)]
    (task,) = seen["rows"]["Task"]
    assert (task["state"], task["last_seq"], task["metadata"]) == (
        TaskState.COMPLETED.value,
        3,
        {"m": 1},
    )
    assert task["updated_at"] == T0 + timedelta(seconds=3)
    assert [(e["seq"], e["payload"]) for e in seen["rows"]["TaskEvent"]][1:] == [
        (2, {"s": 2}),
        (3, {"s": 3}),
    ]


def test_append_events_of_a_terminal_state_closes_the_tasks_dispatches(agent, frozen):
    def scenario(store):
        task = store.lock(_open(store, agent).pk)  # its dispatch: pending
        ExecutorDispatch.objects.create(
            task=task, state=DispatchState.DONE, not_before=T0, progress={}, enqueues=1
        )
        frozen.move_to(T0 + timedelta(seconds=1), tick=False)
        task.state, task.last_seq = TaskState.WORKING.value, 2
        store.append_events(
            task, [TaskEvent(task=task, seq=2, kind="status", payload={}, created_at=T0)]
        )
        still_open = list(ExecutorDispatch.objects.order_by("id").values_list("state", flat=True))
        frozen.move_to(T0 + timedelta(seconds=2), tick=False)
        task.state, task.last_seq = TaskState.COMPLETED.value, 3
        store.append_events(
            task, [TaskEvent(task=task, seq=3, kind="status", payload={}, created_at=T0)]
        )
        frozen.move_to(T0, tick=False)
        return still_open

    seen = both(scenario)
    assert seen["value"] == [DispatchState.PENDING, DispatchState.DONE]
    first, closed_before = seen["rows"]["ExecutorDispatch"]
    assert (first["state"], first["lease_expires_at"]) == (DispatchState.DONE, None)
    assert first["updated_at"] == T0 + timedelta(seconds=2)  # stamped as the task row
    assert closed_before["updated_at"] == T0  # already DONE: untouched


def test_append_events_to_a_task_that_moved_since_it_was_read_writes_nothing(agent, frozen):
    """A write built from a task row read before another write moved it (a quick claim's
    row, then a cancel) is refused whole: no task field, event, artifact or dispatch close."""

    def scenario(store):
        stale = Task.objects.get(pk=_open(store, agent).pk)  # read unlocked, at seq 1
        task = store.lock(stale.pk)
        task.state, task.last_seq = TaskState.CANCELED.value, 2
        canceled = TaskEvent(task=task, seq=2, kind="status", payload={"c": 1}, created_at=T0)
        store.append_events(task, [canceled])
        ExecutorDispatch.objects.update(state=DispatchState.PENDING)  # one left to close
        before = _rows()
        frozen.move_to(T0 + timedelta(seconds=1), tick=False)
        stale.state, stale.last_seq = TaskState.COMPLETED.value, 4
        answer = [
            TaskEvent(task=stale, seq=seq, kind=kind, payload={}, created_at=T0)
            for seq, kind in ((2, "status"), (3, "artifact"), (4, "status"))
        ]
        artifact = Artifact(task=stale, artifact_id="echo", parts=[{"text": "hi"}])
        written = store.append_events(stale, answer, artifact)
        frozen.move_to(T0, tick=False)
        return written, _rows() == before, [e.pk for e in answer], artifact.pk

    seen = both(scenario)
    assert seen["value"] == [False, True, [None, None, None], None]
    (task,) = seen["rows"]["Task"]
    assert (task["state"], task["last_seq"]) == (TaskState.CANCELED.value, 2)
    assert seen["rows"]["Artifact"] == []
    assert [e["payload"] for e in seen["rows"]["TaskEvent"]] == [{"s": 1}, {"c": 1}]
    assert [d["state"] for d in seen["rows"]["ExecutorDispatch"]] == [DispatchState.PENDING]


def test_latest_user_parts_reads_the_newest_user_message_only(agent):
    def scenario(store):
        task = _open(store, agent)  # its first message: a user's, "hi"
        first = store.latest_user_parts(task.pk)
        Message.objects.create(task=task, message_id="a1", role="ROLE_AGENT", parts=[{"text": "a"}])
        after_agent = store.latest_user_parts(task.pk)
        Message.objects.create(task=task, message_id="u2", role="ROLE_USER", parts=[{"text": "2"}])
        return [
            store.latest_user_parts(uuid.UUID(int=7)),
            first,
            after_agent,
            store.latest_user_parts(task.pk),
        ]

    seen = both(scenario)
    assert seen["value"] == [None, [{"text": "hi"}], [{"text": "hi"}], [{"text": "2"}]]


def test_settled_snapshot_says_whether_a_waiter_has_its_answer_and_reads_it(agent):
    def event(task: Task, seq: int, kind: str) -> TaskEvent:
        return TaskEvent(task=task, seq=seq, kind=kind, payload={}, created_at=T0)

    def scenario(store):
        def key(after_seq, *, owner="o", pk=TASK_PK, limit=None):
            return SettledKey(agent.pk, owner, pk, limit, after_seq=after_seq)

        def read(after_seq, **kw):
            return store.settled_snapshots([key(after_seq, **kw)])[0]

        gone = [read(None, pk=uuid.UUID(int=7)), read(None, owner="other")]
        task = store.lock(_open(store, agent).pk)
        submitted = read(None)
        task.state, task.last_seq = TaskState.INPUT_REQUIRED.value, 3
        store.append_events(task, [event(task, 2, "status"), event(task, 3, "message")])
        # Interrupted: a status event after seq 1 (the one that interrupted it), none after 2.
        settled = [read(None), read(1), read(2), read(1, limit=0)]
        # The same keys read together (waiters woken in one turn), a foreign one among them.
        together = store.settled_snapshots(
            [key(None), key(1), key(None, owner="other"), key(2), key(1, limit=0)]
        )
        snapshot = store.visible_snapshots([SnapshotKey(agent.pk, "o", TASK_PK, None)])[0]
        return gone, submitted, settled, together, snapshot

    seen = both(scenario)
    gone, submitted, settled, together, snapshot = seen["value"]
    assert together == [*settled[:2], None, *settled[2:]]
    assert gone == [None, None]
    assert submitted == [False, None]
    # Settled, it comes with the task as GetTask's read reads it (the history as asked).
    assert settled[0] == settled[1] == [True, snapshot]
    assert snapshot[0][1]["state"] == TaskState.INPUT_REQUIRED.value
    assert settled[2] == [False, None]
    assert settled[3] == [True, [snapshot[0], [], []]]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("auto", PgTaskStore), ("orm", OrmTaskStore), ("postgres", PgTaskStore)],
)
def test_get_task_store_follows_the_setting(settings, choice, expected):
    settings.A2A_STORE = choice
    assert type(get_task_store()) is expected


def test_get_task_store_refuses_postgres_on_another_database_and_unknown_values(
    settings, monkeypatch
):
    from django.db import connection

    settings.A2A_STORE = "nonsense"
    with pytest.raises(ImproperlyConfigured):
        get_task_store()
    monkeypatch.setattr(connection, "vendor", "sqlite")
    settings.A2A_STORE = "postgres"
    with pytest.raises(ImproperlyConfigured):
        get_task_store()
    settings.A2A_STORE = "auto"
    assert type(get_task_store()) is OrmTaskStore


def test_open_tasks_writes_many_tasks_each_only_with_its_receipt(agent):
    """One call, five tasks: two without a receipt, one whose receipt an earlier call took,
    and two with the same receipt key (the first of them wins). Each answer at its position;
    the tasks written have all their rows and ids, the others none."""

    def scenario(store):
        pk = uuid.UUID
        assert store.open_tasks([_receipt(agent, _new_task_rows(agent, pk(int=1), progress={}))])
        news = [
            _new_task_rows(agent, pk(int=2), progress={}, message_id="a"),
            _receipt(agent, _new_task_rows(agent, pk(int=3), progress={})),  # m1: taken
            _receipt(agent, _new_task_rows(agent, pk(int=4), progress={}, message_id="b")),
            _receipt(agent, _new_task_rows(agent, pk(int=5), progress={}, message_id="b"), "h2"),
            _new_task_rows(agent, pk(int=6), progress={"p": 6}, message_id="c"),
        ]
        opened = store.open_tasks(news)
        ids = [
            [r.pk is not None and type(r).objects.get(task=new.task).pk == r.pk for r in rows]
            for new in news
            for rows in [(new.message, new.event, new.dispatch)]
        ]
        receipts = dict(MessageReceipt.objects.values_list("message_id", "task_id"))
        return (
            opened,
            ids,
            receipts,
            sorted(t.int for t in Task.objects.values_list("pk", flat=True)),
        )

    seen = both(scenario)
    opened, ids, receipts, tasks = seen["value"]
    assert opened == [True, False, True, False, True]
    assert ids == [[True] * 3, [False] * 3, [True] * 3, [False] * 3, [True] * 3]
    assert receipts == {"m1": uuid.UUID(int=1), "b": uuid.UUID(int=4)}
    assert tasks == [1, 2, 4, 6]
    assert {name: len(rows) for name, rows in seen["rows"].items()} == {
        "Task": 4,
        "Message": 4,
        "Artifact": 0,
        "TaskEvent": 4,
        "ExecutorDispatch": 4,
        "MessageReceipt": 2,
    }
    assert [d["progress"] for d in seen["rows"]["ExecutorDispatch"]][-1] == {"p": 6}


@pytest.mark.parametrize("choice", ["orm", "postgres"])
def test_services_and_selectors_use_the_store_the_setting_chooses(
    agent, settings, monkeypatch, choice
):
    from tasks import selectors
    from tests.factories import user_message

    settings.A2A_STORE = choice
    used = []
    for cls in (PgTaskStore, OrmTaskStore):
        for method in ("open_tasks", "visible"):
            original = getattr(cls, method)
            name = f"{cls.__name__}.{method}"

            def spy(self, *args, _original=original, _name=name):
                used.append(_name)
                return _original(self, *args)

            monkeypatch.setattr(cls, method, spy)
    task = task_create(agent=agent, owner="o", message=user_message())
    assert selectors.task_for_owner(agent_id=agent.pk, owner="o", task_id=task.pk) is not None
    prefix = {"orm": "OrmTaskStore", "postgres": "PgTaskStore"}[choice]
    assert used == [f"{prefix}.open_tasks", f"{prefix}.visible"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", list(STORES))
def test_open_task_outside_a_transaction_writes_all_its_rows_or_none(name, agent):
    """task_send runs a new task's write alone, without a transaction around it: the call
    itself must be atomic (one statement; the ORM twin's own transaction)."""
    from django.db import IntegrityError, connection

    store = STORES[name]
    assert not connection.in_atomic_block

    # The last row cannot be written (progress is NOT NULL): nothing of the task stays.
    with pytest.raises(IntegrityError):
        store.open_tasks([_new_task_rows(agent, uuid.UUID(int=7))])
    assert (Task.objects.count(), Message.objects.count(), TaskEvent.objects.count()) == (0, 0, 0)
    # Nor of the others written with it: the call is all of its tasks or none.
    good = _new_task_rows(agent, uuid.UUID(int=6), progress={}, message_id="m0")
    with pytest.raises(IntegrityError):
        store.open_tasks([good, _new_task_rows(agent, uuid.UUID(int=7))])
    assert (Task.objects.count(), Message.objects.count(), TaskEvent.objects.count()) == (0, 0, 0)
    assert store.open_tasks([_new_task_rows(agent, uuid.UUID(int=8), progress={})]) == [True]
    assert Task.objects.get().pk == uuid.UUID(int=8)


def test_append_events_together_writes_each_unmoved_task_and_nothing_of_a_moved_one(agent, frozen):
    """Three tasks read unlocked at seq 1 (quick claims' rows), one canceled since: the two
    unmoved ones are written whole (a terminal answer with its artifact and its dispatch
    closed; a move to WORKING that leaves its dispatch open), the moved one not at all."""
    pks = [uuid.UUID(int=0x4000_8000_0000_0000_0000 + n) for n in (3, 1, 2)]

    def scenario(store):
        seen = [Task.objects.get(pk=_open(store, agent, pk=pk).pk) for pk in pks]
        moved = store.lock(pks[2])
        moved.state, moved.last_seq = TaskState.CANCELED.value, 2
        store.append_events(
            moved, [TaskEvent(task=moved, seq=2, kind="status", payload={"c": 1}, created_at=T0)]
        )
        frozen.move_to(T0 + timedelta(seconds=1), tick=False)
        answered, working, stale = seen
        answered.state, answered.last_seq = TaskState.COMPLETED.value, 4
        answered.status_message = {"role": "ROLE_AGENT", "parts": [{"text": "done"}]}
        working.state, working.last_seq = TaskState.WORKING.value, 2
        stale.state, stale.last_seq = TaskState.COMPLETED.value, 4

        def events(task, kinds):
            return [
                TaskEvent(
                    task=task,
                    seq=seq,
                    kind=kind,
                    payload={"k": kind, "t": str(task.pk)},
                    created_at=T0,
                )
                for seq, kind in enumerate(kinds, start=2)
            ]

        answer = events(answered, ["status", "artifact", "status"])
        art = Artifact(task=answered, artifact_id="echo", parts=[{"text": "hi"}], complete=True)
        writes = [
            (answered, answer, art),
            (working, events(working, ["status"]), None),
            (
                stale,
                events(stale, ["status", "artifact", "status"]),
                Artifact(task=stale, artifact_id="echo", parts=[{"text": "no"}]),
            ),
        ]
        written = store.append_events_together(writes)
        frozen.move_to(T0, tick=False)
        stored = {(e.task_id, e.seq): e.pk for e in TaskEvent.objects.all()}
        return (
            sorted(str(pk) for pk in written),
            [
                [e.pk is not None and e.pk == stored.get((t.pk, e.seq)) for e in evs]
                for t, evs, _ in writes
            ],
            [e.pk for e in writes[2][1]] + [writes[2][2].pk],
            (art.pk == Artifact.objects.get(task_id=answered.pk).pk, art.created_at),
        )

    seen = both(scenario)
    written, pks_set, stale_pks, saved_art = seen["value"]
    assert written == sorted(str(pk) for pk in pks[:2])
    assert pks_set == [[True, True, True], [True], [False, False, False]]
    assert stale_pks == [None, None, None, None]
    assert saved_art == [True, T0 + timedelta(seconds=1)]
    tasks = {t["id"]: t for t in seen["rows"]["Task"]}
    answered, working, canceled = (tasks[pk] for pk in pks)
    assert (answered["state"], answered["last_seq"]) == (TaskState.COMPLETED.value, 4)
    assert answered["status_message"] == {"role": "ROLE_AGENT", "parts": [{"text": "done"}]}
    assert answered["updated_at"] == T0 + timedelta(seconds=1)
    assert answered["metadata"] == {"m": 1}  # not a lifecycle field: untouched
    assert (working["state"], working["last_seq"]) == (TaskState.WORKING.value, 2)
    assert (canceled["state"], canceled["last_seq"]) == (TaskState.CANCELED.value, 2)
    (artifact,) = seen["rows"]["Artifact"]
    assert (artifact["task_id"], artifact["parts"]) == (pks[0], [{"text": "hi"}])
    by_task = {}
    for e in seen["rows"]["TaskEvent"]:
        by_task.setdefault(e["task_id"], []).append((e["seq"], e["kind"]))
    assert sorted(by_task[pks[0]]) == [(1, "status"), (2, "status"), (3, "artifact"), (4, "status")]
    assert sorted(by_task[pks[1]]) == [(1, "status"), (2, "status")]
    assert sorted(by_task[pks[2]]) == [(1, "status"), (2, "status")]  # the cancel alone
    dispatches = {d["task_id"]: d for d in seen["rows"]["ExecutorDispatch"]}
    assert dispatches[pks[0]]["state"] == DispatchState.DONE  # closed by its terminal answer
    assert dispatches[pks[0]]["updated_at"] == T0 + timedelta(seconds=1)
    assert dispatches[pks[1]]["state"] == DispatchState.PENDING  # WORKING: still open
    # The canceled task's dispatch was closed by the cancel, at T0, and not touched since.
    assert (dispatches[pks[2]]["state"], dispatches[pks[2]]["updated_at"]) == (
        DispatchState.DONE,
        T0,
    )


def test_append_events_together_of_one_task_is_append_events(agent, frozen):
    def scenario(store):
        task = Task.objects.get(pk=_open(store, agent).pk)
        task.state, task.last_seq = TaskState.WORKING.value, 2
        event = TaskEvent(task=task, seq=2, kind="status", payload={}, created_at=T0)
        first = store.append_events_together([(task, [event], None)])
        again = store.append_events_together([(task, [event], None)])  # seq 1 expected: moved
        return [sorted(str(pk) for pk in first), sorted(again), event.pk is not None]

    seen = both(scenario)
    assert seen["value"] == [[str(TASK_PK)], [], True]
