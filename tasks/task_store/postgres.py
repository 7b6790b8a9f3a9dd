"""`PgTaskStore`, what production runs: each step is one prepared statement, generated from
the models' `_meta` (tasks/task_store/sql.py, and claims.py for the dispatch claims), so an
artifact event is four round trips with the outbox's write instead of nine ORM statements,
each built in Python and planned by PostgreSQL (the ORM path cost 4 ms CPU per event in the
producer and 2 ms in PostgreSQL: bench/delivery_bench.py)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, models

from a2a_platform.lib.sql import from_json_rows, from_row, json_param, json_rows, run_prepared
from agents.models import Agent
from tasks.models import (
    Artifact,
    DispatchState,
    EventKind,
    ExecutorDispatch,
    Message,
    MessageReceipt,
    MessageRole,
    Task,
    TaskEvent,
)
from tasks.states import INTERRUPTED_STATES, SETTLED_STATES, TERMINAL_STATES, TERMINAL_VALUES
from tasks.task_store.base import (
    LIFECYCLE_FIELDS,
    DispatchClaimRow,
    DispatchRelease,
    EventsWrite,
    NewTask,
    ReleaseOutcome,
    SettledKey,
    Snapshot,
    SnapshotKey,
)
from tasks.task_store.claims import (
    _CLAIM_NEXT,
    _CLAIM_ONE,
    _claim_dispatch_sql,
    _release_lock_sql,
    _release_sql,
)
from tasks.task_store.sql import (
    _NEW_TASK_ROWS,
    _append_events_sql,
    _append_events_together_sql,
    _artifact_sql,
    _artifacts_sql,
    _claim_receipt_sql,
    _history_sql,
    _latest_user_parts_sql,
    _lock_sql,
    _open_tasks_sql,
    _settled_snapshots_sql,
    _visible_snapshots_sql,
    _visible_sql,
)


def _saved(obj: models.Model, pk: object) -> None:
    obj.pk = pk
    obj._state.adding = False
    obj._state.db = connection.alias


_PROGRESS = ExecutorDispatch._meta.get_field("progress")
_PARTS = Message._meta.get_field("parts")
_DISPATCH_STATES = {
    "pending": DispatchState.PENDING.value,
    "claimed": DispatchState.CLAIMED.value,
    "done": DispatchState.DONE.value,
}
_TERMINAL = list(TERMINAL_VALUES)  # a list: psycopg sends it as an array
_SETTLED = sorted(s.value for s in SETTLED_STATES)
_STATUS = EventKind.STATUS.value
_USER = MessageRole.USER.value
_INTERRUPTED = frozenset(s.value for s in INTERRUPTED_STATES)


def _key_arrays(keys: list[SnapshotKey]) -> dict[str, list]:
    """The snapshot statements' parameters: one array per key field, in the keys' order."""
    return {
        "tasks": [k.task_pk for k in keys],
        "agents": [k.agent_pk for k in keys],
        "owners": [k.owner for k in keys],
        "limits": [k.history_limit for k in keys],
    }


def _snapshot(row) -> Snapshot:
    """A snapshot statement's row (the task's columns, its history, its artifacts) as
    `visible_snapshots` returns it."""
    *values, history, artifacts = row
    task = from_row(Task, values)
    messages = from_json_rows(Message, history)
    for message in messages:
        message.task = task
    return task, messages, from_json_rows(Artifact, artifacts)


class PgTaskStore:
    """TaskStore as prepared SQL statements (PostgreSQL only)."""

    def __init__(self, *, notify: bool = True) -> None:
        """`notify=False` leaves out the event hub's NOTIFY: only bench/stream_bench.py does,
        to measure what the NOTIFY costs."""
        self._notify = notify

    def claim_receipt(self, receipt: MessageReceipt) -> bool:
        rows = run_prepared(_claim_receipt_sql(), {"receipt": json_rows(MessageReceipt, [receipt])})
        if rows:
            _saved(receipt, rows[0][0])
        return bool(rows)

    def open_tasks(self, news: Sequence[NewTask]) -> list[bool]:
        receipts = [new.receipt for new in news if new.receipt is not None]
        params = {"receipt": json_rows(MessageReceipt, receipts)}
        for alias, model in _NEW_TASK_ROWS:
            params[alias] = json_rows(model, [getattr(new, alias) for new in news])
        written = {row[0]: row[1:] for row in run_prepared(_open_tasks_sql(), params)}
        opened = []
        for new in news:
            pks = written.get(new.task.pk)
            opened.append(pks is not None)
            if pks is None:
                continue
            receipt_pk, *row_pks = pks
            if new.receipt is not None:
                _saved(new.receipt, receipt_pk)
            rows = (new.task, new.message, new.event, new.dispatch)
            for obj, pk in zip(rows, (new.task.pk, *row_pks), strict=True):
                _saved(obj, pk)
        return opened

    def lock(self, task_pk: uuid.UUID) -> Task | None:
        rows = run_prepared(_lock_sql(), {"task": task_pk})
        if not rows:
            return None
        split = len(Task._meta.concrete_fields)
        task = from_row(Task, rows[0][:split])
        task.agent = from_row(Agent, rows[0][split:])
        return task

    def artifact(self, task: Task, artifact_id: str) -> Artifact | None:
        rows = run_prepared(_artifact_sql(), {"task": task.pk, "artifact": artifact_id})
        return from_row(Artifact, rows[0]) if rows else None

    def visible(self, agent_pk: int, owner: str, task_pk: uuid.UUID) -> Task | None:
        rows = run_prepared(_visible_sql(), {"task": task_pk, "agent": agent_pk, "owner": owner})
        return from_row(Task, rows[0]) if rows else None

    def visible_snapshots(self, keys: list[SnapshotKey]) -> list[Snapshot | None]:
        found: list[Snapshot | None] = [None] * len(keys)
        for position, *row in run_prepared(_visible_snapshots_sql(), _key_arrays(keys)):
            found[position - 1] = _snapshot(row)
        return found

    def settled_snapshots(
        self, keys: list[SettledKey]
    ) -> list[tuple[bool, Snapshot | None] | None]:
        params = _key_arrays(keys) | {
            "after": [k.after_seq for k in keys],
            "settled": _SETTLED,
            "status": _STATUS,
        }
        found: list[tuple[bool, Snapshot | None] | None] = [None] * len(keys)
        for position, settled, *row in run_prepared(_settled_snapshots_sql(), params):
            found[position - 1] = (True, _snapshot(row)) if settled else (False, None)
        return found

    def latest_user_parts(self, task_pk: uuid.UUID) -> list | None:
        rows = run_prepared(_latest_user_parts_sql(), {"task": task_pk, "role": _USER})
        if not rows:
            return None
        return _PARTS.from_db_value(rows[0][0], None, connection)

    def history(self, task: Task, limit: int | None) -> list[Message]:
        rows = run_prepared(_history_sql(), {"task": task.pk, "limit": limit})
        messages = [from_row(Message, row) for row in reversed(rows)]
        for message in messages:
            message.task = task
        return messages

    def artifacts(self, task: Task) -> list[Artifact]:
        return [
            from_row(Artifact, row) for row in run_prepared(_artifacts_sql(), {"task": task.pk})
        ]

    def append_events(
        self, task: Task, events: list[TaskEvent], artifact: Artifact | None = None
    ) -> bool:
        params: dict[str, object] = {
            "task_pk": task.pk,
            "expected_seq": events[0].seq - 1,
            "events": json_rows(TaskEvent, events),
        }
        if artifact is not None:
            params["artifact"] = json_rows(Artifact, [artifact])
        for name in LIFECYCLE_FIELDS:  # as save(update_fields=...) would write them
            field = Task._meta.get_field(name)
            params[f"task_{field.attname}"] = field.get_db_prep_save(
                field.pre_save(task, False), connection
            )
        close = task.task_state in TERMINAL_STATES
        if close:
            params |= _DISPATCH_STATES
        statement = _append_events_sql(self._notify, close, artifact is not None)
        rows = run_prepared(statement, params)
        if not rows:
            return False
        by_seq = {seq: pk for pk, seq, *_ in rows}
        for event in events:
            _saved(event, by_seq[event.seq])
        if artifact is not None:
            _, _, pk, artifact.created_at, *_ = rows[0]
            _saved(artifact, pk)
        return True

    def append_events_together(self, writes: Sequence[EventsWrite]) -> set[object]:
        if len(writes) == 1:
            task, events, artifact = writes[0]
            return {task.pk} if self.append_events(task, events, artifact) else set()
        lifecycle = [Task._meta.get_field(name) for name in LIFECYCLE_FIELDS]
        tasks = [
            {
                "id": task.pk,
                "expected_seq": events[0].seq - 1,
                # As save(update_fields=...) would write them (updated_at stamped).
                **{f.column: f.pre_save(task, False) for f in lifecycle},
            }
            for task, events, _ in writes
        ]
        rows = run_prepared(
            _append_events_together_sql(self._notify),
            {
                "tasks": json_param(tasks),
                "ids": [task.pk for task, _, _ in writes],
                "closing": [task.pk for task, _, _ in writes if task.task_state in TERMINAL_STATES],
                "events": json_rows(TaskEvent, [e for _, events, _ in writes for e in events]),
                "artifacts": json_rows(Artifact, [a for _, _, a in writes if a is not None]),
                **_DISPATCH_STATES,
            },
        )
        saved = {
            (task_id, seq): (pk, art_pk, art_created)
            for pk, task_id, seq, art_pk, art_created, *_ in rows
        }
        written = {task_id for task_id, _ in saved}
        for task, events, artifact in writes:
            if task.pk not in written:
                continue
            for event in events:
                _saved(event, saved[(task.pk, event.seq)][0])
            if artifact is not None:
                _, pk, artifact.created_at = saved[(task.pk, events[0].seq)]
                _saved(artifact, pk)
        return written

    def claim_dispatch(
        self, dispatch_id: int, worker: str, now: datetime, lease_until: datetime
    ) -> DispatchClaimRow | None:
        rows = self._claim(_CLAIM_ONE, {"id": dispatch_id}, worker, now, lease_until)
        return rows[0] if rows else None

    def claim_next_dispatches(
        self,
        executors: tuple[str, ...],
        due_since: datetime,
        worker: str,
        now: datetime,
        lease_until: datetime,
        limit: int,
    ) -> list[DispatchClaimRow]:
        which = {"executors": list(executors), "since": due_since, "limit": limit, "role": _USER}
        claimed = self._claim(_CLAIM_NEXT, which, worker, now, lease_until, quick=True)
        # UPDATE … RETURNING follows no order: in the order the dispatches were opened.
        return sorted(claimed, key=lambda row: row.dispatch_id)

    def _claim(
        self, which: str, params: dict, worker, now, lease_until, *, quick: bool = False
    ) -> list[DispatchClaimRow]:
        rows = run_prepared(
            _claim_dispatch_sql(which, quick),
            {
                **params,
                "worker": worker[:255],
                "now": now,
                "lease": lease_until,
                "terminal": _TERMINAL,
                **_DISPATCH_STATES,
            },
        )
        return [
            DispatchClaimRow(
                claimed,
                task_id,
                _PROGRESS.from_db_value(progress, None, connection),
                lease,
                executor,
                dispatch_id,
                _PARTS.from_db_value(quick_read[0], None, connection) if quick_read else None,
                from_row(Task, quick_read[1:]) if quick_read else None,
            )
            for claimed, task_id, progress, lease, executor, dispatch_id, *quick_read in rows
        ]

    def release_dispatch(
        self,
        dispatch_id: int,
        worker: str,
        *,
        progress: dict | None,
        again_at: datetime | None,
        now: datetime,
    ) -> DispatchRelease | None:
        rows = run_prepared(_release_lock_sql(), {"id": dispatch_id})
        if not rows:
            return None
        ((task_id, task_state, executor),) = rows
        rows = run_prepared(
            _release_sql(),
            {
                "id": dispatch_id,
                "worker": worker[:255],
                "task": task_id,
                "again": again_at is not None and task_state not in _TERMINAL,
                "again_at": again_at,
                "interrupted": task_state in _INTERRUPTED,
                "message": EventKind.MESSAGE.value,
                "status": EventKind.STATUS.value,
                "progress": None
                if progress is None
                else _PROGRESS.get_db_prep_save(progress, connection),
                "now": now,
                **_DISPATCH_STATES,
            },
        )
        return DispatchRelease(ReleaseOutcome(rows[0][0]), task_id, executor) if rows else None
