"""The lifecycle's hot statements, for PostgreSQL and for the embedded database.

tasks/services.py decides (the state machine, the artifact chunk rules, what the event says);
this module only reads and writes the rows, inside the caller's transaction (the few calls
documented as atomic on their own may also run outside one: one statement on PostgreSQL
commits as it returns, without BEGIN and COMMIT round trips). `TaskStore` is
the interface, one docstring per method; two implementations, as Django's database backends
implement one set of operations per vendor:

- `PgTaskStore`, what production runs: each step is one prepared statement, generated from the
  models' `_meta`, so an artifact event is four round trips with the outbox's write instead of
  nine ORM statements, each built in Python and planned by PostgreSQL (the ORM path cost 4 ms
  CPU per event in the producer and 2 ms in PostgreSQL: bench/delivery_bench.py);
- `OrmTaskStore`, the same through the ORM, on any database: the embedded SQLite database of
  `make run`, and PostgreSQL behind a transaction-pooling proxy that cannot keep prepared
  statements.

`get_task_store()` is the one switch (`settings.A2A_STORE`). tests/integration/tasks/
test_task_store.py holds the two to one contract; test_services.py runs the services through
both.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connection, models, transaction

from a2a_platform.lib.sql import (
    columns,
    from_json_rows,
    from_row,
    insert_json_rows,
    json_param,
    json_rows,
    run_prepared,
)
from agents.models import Agent
from tasks.models import (
    ACTIVE_DISPATCH_STATES,
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
from tasks.notify import CHANNEL, notify_task_event
from tasks.states import INTERRUPTED_STATES, SETTLED_STATES, TERMINAL_STATES

# The task fields a lifecycle write may change (the rest are set when the task opens).
LIFECYCLE_FIELDS = (
    "state",
    "status_timestamp",
    "status_message",
    "answered_with_message",
    "last_seq",
    "updated_at",
)


# A task with its history and artifacts: GetTask's read.
Snapshot = tuple[Task, list[Message], list[Artifact]]

# One task's write of `append_events`: the task as it is now, its new events (numbered from
# its last_seq before them), the artifact one of them adds or None.
EventsWrite = tuple[Task, list[TaskEvent], Artifact | None]


@dataclass(frozen=True)
class SnapshotKey:
    """Which task `visible_snapshots` reads, for whom, and how much of its history (None all,
    0 none, N the newest N)."""

    agent_pk: int
    owner: str
    task_pk: uuid.UUID
    history_limit: int | None


@dataclass(frozen=True)
class SettledKey(SnapshotKey):
    """A `settled_snapshots` key: with `after_seq`, the task has settled only once a status
    event came after that seq (a follow-up finds its task interrupted: not yet its answer)."""

    after_seq: int | None = None


@dataclass(frozen=True)
class DispatchClaimRow:
    """What `claim_dispatch` did to one dispatch row."""

    claimed: bool  # False: its task was terminal, the dispatch is DONE
    task_id: uuid.UUID
    progress: dict
    lease_expires_at: datetime | None
    executor: str  # the task's agent's executor
    dispatch_id: int = 0
    # The parts of the task's latest user message, read with a quick claim
    # (`claim_next_dispatches`: the quick executors' whole read); None otherwise.
    user_parts: list | None = None
    # The task row as a quick claim read it, not locked; None otherwise.
    task: Task | None = None


@dataclass(frozen=True)
class DispatchRelease:
    """What `release_dispatch` did: "again", "input" or "done", and the agent's executor."""

    outcome: str
    task_id: uuid.UUID
    executor: str


@dataclass(frozen=True)
class NewTask:
    """A new task's rows as `open_tasks` writes them (none saved yet), and the idempotency
    receipt it is written only with, if any."""

    task: Task
    message: Message
    event: TaskEvent
    dispatch: ExecutorDispatch
    receipt: MessageReceipt | None = None


class TaskStore(Protocol):
    """The rows of the task lifecycle, read and written inside the caller's transaction."""

    def claim_receipt(self, receipt: MessageReceipt) -> bool:
        """Insert an idempotency receipt unless one exists for its (agent, owner, messageId).

        True: inserted (`receipt` now has its pk). False: the request is a retry; nothing was
        written and the caller's transaction goes on.
        """
        ...

    def open_tasks(self, news: Sequence[NewTask]) -> list[bool]:
        """Insert new tasks' rows: each task, its first message, its first event and its
        executor dispatch, for any number of tasks (one statement on PostgreSQL), atomic on
        its own, all of them or none: outside a transaction it commits as it returns. Each
        object written gets its pk. No NOTIFY. True or False per task, in order.

        A task with a `receipt` is written only if its receipt is claimed, as
        `claim_receipt` does, in the same statement: False when the receipt was taken (a
        retry, or an earlier task of the same call with the same agent, owner and
        messageId), and then none of that task's rows was written."""
        ...

    def lock(self, task_pk: uuid.UUID) -> Task | None:
        """The task row locked FOR UPDATE until the transaction ends, with its agent loaded
        (only the task row is locked: locking the agent too would make every write to any task
        of that agent wait for the others). None for an unknown id."""
        ...

    def artifact(self, task: Task, artifact_id: str) -> Artifact | None:
        """One artifact of a task by its artifactId, or None."""
        ...

    def visible(self, agent_pk: int, owner: str, task_pk: uuid.UUID) -> Task | None:
        """The task if it belongs to this agent and owner, else None (foreign = unknown)."""
        ...

    def visible_snapshots(self, keys: list[SnapshotKey]) -> list[Snapshot | None]:
        """For each key, in order: `visible`, `history` (the key's `history_limit`) and
        `artifacts` of its task together, or None (unknown or foreign). One statement on
        PostgreSQL however many keys: GetTask's read, its concurrent calls read together
        (a2a_platform/lib/orm.Coalesced)."""
        ...

    def latest_user_parts(self, task_pk: uuid.UUID) -> list | None:
        """The parts of the task's latest user message (None: it has none): a quick executor's
        whole read, one column of one row."""
        ...

    def settled_snapshots(
        self, keys: list[SettledKey]
    ) -> list[tuple[bool, Snapshot | None] | None]:
        """For each key, in order, whether its task (`visible` to the key's agent and owner)
        has settled: it is terminal or interrupted and, with `after_seq`, a status event came
        after that seq. Settled: (True, its snapshot as `visible_snapshots` reads it), read
        with it; not yet: (False, None); None when it is not visible. One statement on
        PostgreSQL however many keys: blocking SendMessages' reads on a wake-up (the waiters
        an answered batch wakes together read together), their answers included."""
        ...

    def history(self, task: Task, limit: int | None) -> list[Message]:
        """The task's messages oldest first: all (None) or the newest `limit`; each message's
        `task` is `task` (no query to reach it)."""
        ...

    def artifacts(self, task: Task) -> list[Artifact]:
        """The task's artifacts in the order they were first added."""
        ...

    def append_events(
        self, task: Task, events: list[TaskEvent], artifact: Artifact | None = None
    ) -> bool:
        """Insert the events (each gets its pk; one statement on PostgreSQL however many),
        write the task row's LIFECYCLE_FIELDS as they are on `task` (updated_at stamped), and
        queue the event hub's NOTIFY for commit. A terminal state written closes the task's
        active (pending or claimed) dispatches too, DONE: a finished task has nothing left
        to run. With `artifact` (the one an artifact event among them adds), insert it, or
        replace the one with its (task, artifactId) in place (it keeps its pk and created_at,
        which are set on `artifact`), in the same statement.

        All of it only if the stored task has not moved since `task` was read: its last_seq
        is still the one before the first event (every lifecycle write moves it). True:
        written. False: the task moved (or is gone); nothing was written or queued. A caller
        holding the task's lock always gets True; one that read the task unlocked (a quick
        claim) writes this way without taking the lock first."""
        ...

    def append_events_together(self, writes: Sequence[EventsWrite]) -> set[object]:
        """`append_events` for several tasks (each at most once), in one statement on
        PostgreSQL however many: every one of their task rows locked in id order (a rebind's
        order), the moved ones too, then each one written, with its events, its artifact and
        its dispatches closed, only if it has not moved. Returns the pks of the tasks
        written; the others wrote nothing, and a caller that then writes one of them under
        its lock takes no lock out of order."""
        ...

    def claim_dispatch(
        self, dispatch_id: int, worker: str, now: datetime, lease_until: datetime
    ) -> DispatchClaimRow | None:
        """Claim a pending, due dispatch for `worker` until `lease_until`, locking (and
        skipping when another transaction holds it) only the dispatch row. A dispatch whose
        task is terminal is marked DONE instead (`claimed` False). None: gone, not pending,
        not yet due, or locked. Atomic on its own (`open_tasks`)."""
        ...

    def claim_next_dispatches(
        self,
        executors: tuple[str, ...],
        due_since: datetime,
        worker: str,
        now: datetime,
        lease_until: datetime,
        limit: int,
    ) -> list[DispatchClaimRow]:
        """Claim, as `claim_dispatch` does, the oldest `limit` pending dispatches of agents
        whose executor is one of `executors` that fell due in (`due_since`, `now`], skipping
        locked ones (one statement on PostgreSQL), oldest first, each claimed one with its
        task's row (`task`, not locked: `append_events` writes it only if it did not move)
        and `latest_user_parts` (`user_parts`). Empty: there is none. Atomic on its own
        (`open_tasks`)."""
        ...

    def release_dispatch(
        self,
        dispatch_id: int,
        worker: str,
        *,
        progress: dict | None,
        again_at: datetime | None,
        now: datetime,
    ) -> DispatchRelease | None:
        """Release `worker`'s claim: the task row locked first, then the dispatch (the
        lifecycle services' lock order). Pending again at `again_at` when it is given and the
        task is not terminal ("again"); pending now when the task waits for input and a client
        message came after its latest status change ("input"); else DONE ("done"). Both
        pending outcomes set `enqueues` to 1 (the caller publishes the job). `progress`
        None keeps the stored progress. None: the task or the held claim is gone."""
        ...


# --- PostgreSQL ----------------------------------------------------------------------------


@functools.cache
def _lock_sql() -> str:
    return (
        f"SELECT {columns(Task, 't')}, {columns(Agent, 'a')} "
        "FROM tasks_task t JOIN agents_agent a ON a.id = t.agent_id "
        "WHERE t.id = %(task)s FOR UPDATE OF t"
    )


@functools.cache
def _artifact_sql() -> str:
    return (
        f"SELECT {columns(Artifact, 'x')} FROM tasks_artifact x "
        "WHERE x.task_id = %(task)s AND x.artifact_id = %(artifact)s"
    )


@functools.cache
def _visible_sql() -> str:
    return (
        f"SELECT {columns(Task, 't')} FROM tasks_task t "
        "WHERE t.id = %(task)s AND t.agent_id = %(agent)s AND t.owner = %(owner)s"
    )


def _history_and_artifacts() -> tuple[str, str]:
    """The two columns a snapshot adds to task `t`'s row for key `k`: its newest `k.lim`
    messages (NULL all) and its artifacts, each a `json_agg` (`from_json_rows`)."""
    history = (
        f"(SELECT json_agg(json_build_array({columns(Message, 'h')}) ORDER BY h.id) FROM ("
        "SELECT * FROM tasks_message m WHERE m.task_id = t.id "
        "ORDER BY m.id DESC LIMIT k.lim) h)"
    )
    artifacts = (
        f"(SELECT json_agg(json_build_array({columns(Artifact, 'x')}) ORDER BY x.id) "
        "FROM tasks_artifact x WHERE x.task_id = t.id)"
    )
    return history, artifacts


@functools.cache
def _visible_snapshots_sql() -> str:
    """Each key's task with its history and artifacts, after the key's position (1-based) in
    the arrays; a key whose task is not visible has no row."""
    history, artifacts = _history_and_artifacts()
    return (
        f"SELECT k.ord, {columns(Task, 't')}, {history}, {artifacts} "
        "FROM unnest(%(tasks)s::uuid[], %(agents)s::integer[], %(owners)s::text[], "
        "%(limits)s::integer[]) WITH ORDINALITY k(task, agent, owner, lim, ord) "
        "JOIN tasks_task t ON t.id = k.task AND t.agent_id = k.agent AND t.owner = k.owner"
    )


@functools.cache
def _settled_snapshots_sql() -> str:
    """For each key (as `_visible_snapshots_sql`, and its `after` seq): whether its task has
    settled (`settled_snapshots`), then the task's row, and its history and artifacts only if
    it has."""
    history, artifacts = _history_and_artifacts()
    return (
        f"SELECT k.ord, s.settled, {columns(Task, 't')}, "
        f"CASE WHEN s.settled THEN {history} END, CASE WHEN s.settled THEN {artifacts} END "
        "FROM unnest(%(tasks)s::uuid[], %(agents)s::integer[], %(owners)s::text[], "
        "%(limits)s::integer[], %(after)s::integer[]) "
        "WITH ORDINALITY k(task, agent, owner, lim, after, ord) "
        "JOIN tasks_task t ON t.id = k.task AND t.agent_id = k.agent AND t.owner = k.owner "
        "CROSS JOIN LATERAL (SELECT t.state = ANY(%(settled)s) AND (k.after IS NULL OR "
        "EXISTS (SELECT FROM tasks_taskevent e WHERE e.task_id = t.id "
        "AND e.kind = %(status)s AND e.seq > k.after)) AS settled) s"
    )


@functools.cache
def _latest_user_parts_sql() -> str:
    return (
        "SELECT m.parts FROM tasks_message m WHERE m.task_id = %(task)s AND m.role = %(role)s "
        "ORDER BY m.id DESC LIMIT 1"
    )


@functools.cache
def _history_sql() -> str:
    return (
        f"SELECT {columns(Message, 'm')} FROM tasks_message m WHERE m.task_id = %(task)s "
        "ORDER BY m.id DESC LIMIT %(limit)s"
    )


@functools.cache
def _artifacts_sql() -> str:
    return (
        f"SELECT {columns(Artifact, 'x')} FROM tasks_artifact x "
        "WHERE x.task_id = %(task)s ORDER BY x.id"
    )


# A new task's rows; the foreign keys to the task are deferred constraints, so their order
# in the statement is free.
_NEW_TASK_ROWS = (
    ("task", Task),
    ("message", Message),
    ("event", TaskEvent),
    ("dispatch", ExecutorDispatch),
)


@functools.cache
def _open_tasks_sql() -> str:
    """New tasks' rows, each task's only if it needs no receipt or its receipt was claimed
    here (in the receipts' key order, so two calls claiming the same keys wait for each other
    in one order and cannot deadlock); a row per task written: its id, then the receipt's,
    message's, event's and dispatch's ids. Each model's rows are one JSON parameter named
    after its alias (`lib/sql.json_rows`), so the statement's text is the same for one task
    or many (one prepared statement)."""
    receipt = insert_json_rows(MessageReceipt, "receipt")
    task = insert_json_rows(Task, "task")
    ctes = [
        f"receipt AS ({receipt} ORDER BY agent_id, owner, message_id "
        "ON CONFLICT (agent_id, owner, message_id) DO NOTHING RETURNING id, task_id)",
        f"task AS ({task} WHERE NOT EXISTS (SELECT FROM jsonb_populate_recordset("
        f"NULL::{MessageReceipt._meta.db_table}, %(receipt)s) r WHERE r.task_id = v.id) "
        "OR v.id IN (SELECT task_id FROM receipt) RETURNING id)",
    ]
    ctes += [
        f"{alias} AS ({insert_json_rows(model, alias)} "
        "WHERE v.task_id IN (SELECT id FROM task) RETURNING id, task_id)"
        for alias, model in _NEW_TASK_ROWS[1:]
    ]
    joins = " ".join(
        f"JOIN {alias} ON {alias}.task_id = task.id" for alias, _ in _NEW_TASK_ROWS[1:]
    )
    return (
        f"WITH {', '.join(ctes)} SELECT task.id, receipt.id, message.id, event.id, dispatch.id "
        f"FROM task LEFT JOIN receipt ON receipt.task_id = task.id {joins}"
    )


@functools.cache
def _claim_receipt_sql() -> str:
    return (
        f"{insert_json_rows(MessageReceipt, 'receipt')} "
        "ON CONFLICT (agent_id, owner, message_id) DO NOTHING RETURNING id"
    )


def _saved(obj: models.Model, pk: object) -> None:
    obj.pk = pk
    obj._state.adding = False
    obj._state.db = connection.alias


def _save_artifact_sql(
    when: str, param: str = "artifact", returning: str = "id, created_at"
) -> str:
    """Insert the rows of %(param)s, or replace in place (the row keeps its id and
    created_at), if `when` holds."""
    kept = {"id", "task_id", "artifact_id", "created_at"}
    replaced = [f.column for f in Artifact._meta.concrete_fields if f.attname not in kept]
    return (
        f"{insert_json_rows(Artifact, param)} WHERE {when} "
        "ON CONFLICT (task_id, artifact_id) DO UPDATE SET "
        f"{', '.join(f'{c} = EXCLUDED.{c}' for c in replaced)} RETURNING {returning}"
    )


@functools.cache
def _append_events_sql(notify: bool, close: bool, artifact: bool) -> str:
    """The task row's lifecycle fields, if its last_seq is still %(expected_seq)s, and only
    then (each other write conditional on the task's): the event rows (%(events)s, one
    INSERT, in their order), with `close` the task's active dispatches DONE (stamped as the
    task row), with `artifact` the artifact saved (its id and created_at on every row
    returned), and (queued until COMMIT, dropped on rollback, as NOTIFY is; one per
    transaction and task, however many rows ask) the event hub's wake-up, in one statement.
    No row returned: nothing was written."""
    fields = [Task._meta.get_field(name) for name in LIFECYCLE_FIELDS]
    sets = ", ".join(f"{f.column} = %(task_{f.attname})s" for f in fields)
    wake = f", pg_notify('{CHANNEL}', %(task_pk)s::text)" if notify else ""
    written = "EXISTS (SELECT FROM task)"
    closed = (
        f"closed AS (UPDATE {_tables()['dispatch']} SET state = %(done)s, "
        "lease_expires_at = NULL, updated_at = %(task_updated_at)s "
        f"WHERE task_id = %(task_pk)s AND state IN (%(pending)s, %(claimed)s) AND {written}), "
        if close
        else ""
    )
    saved, saved_cols = "", ""
    if artifact:
        saved = f"saved AS ({_save_artifact_sql(written)}), "
        saved_cols = ", (SELECT id FROM saved), (SELECT created_at FROM saved)"
    events = f"{insert_json_rows(TaskEvent, 'events')} WHERE {written} RETURNING id, seq"
    return (
        f"WITH task AS (UPDATE tasks_task SET {sets} "
        "WHERE id = %(task_pk)s AND last_seq = %(expected_seq)s RETURNING id), "
        f"{closed}{saved}event AS ({events}) "
        f"SELECT id, seq{saved_cols}{wake} FROM event"
    )


@functools.cache
def _append_events_together_sql(notify: bool) -> str:
    """`_append_events_sql` for several tasks: %(tasks)s one JSON object a task (its id, its
    LIFECYCLE_FIELDS' columns and `expected_seq`), %(ids)s their ids, %(closing)s the ids of
    those whose new state is terminal; %(events)s and %(artifacts)s all their rows. The task
    rows are locked in id order first; every other write is conditional on its task's. One
    row per event written, its artifact's id and created_at beside it; one wake-up per task
    (NOTIFY folds duplicates within a transaction).

    Each table is reached through its keys as arrays (`= ANY(…)`: an index scan whatever the
    table's size), never joined to the JSON rows alone: a prepared statement's plan would
    count on a hundred of those, and a hash join with a scan of the whole table wins that
    count."""
    t = _tables()
    fields = [Task._meta.get_field(name) for name in LIFECYCLE_FIELDS]
    sets = ", ".join(f"{f.column} = w.{f.column}" for f in fields)
    wake = f", pg_notify('{CHANNEL}', e.task_id::text)" if notify else ""
    written = "v.task_id IN (SELECT id FROM task)"
    return (
        "WITH w AS (SELECT v.*, (j ->> 'expected_seq')::integer AS expected_seq "
        f"FROM jsonb_array_elements(%(tasks)s) j, jsonb_populate_record(NULL::{t['task']}, j) v), "
        f"locked AS (SELECT t.id FROM {t['task']} t WHERE t.id = ANY(%(ids)s::uuid[]) "
        "ORDER BY t.id FOR UPDATE), "
        f"task AS (UPDATE {t['task']} t SET {sets} FROM w "
        "WHERE t.id = ANY(%(ids)s::uuid[]) AND t.id IN (SELECT id FROM locked) "
        "AND t.id = w.id AND t.last_seq = w.expected_seq RETURNING t.id, w.updated_at), "
        f"closed AS (UPDATE {t['dispatch']} d SET state = %(done)s, lease_expires_at = NULL, "
        "updated_at = task.updated_at FROM task WHERE d.task_id = ANY(%(closing)s::uuid[]) "
        "AND d.task_id = task.id AND d.state IN (%(pending)s, %(claimed)s)), "
        f"saved AS ({_save_artifact_sql(written, 'artifacts', 'id, created_at, task_id')}), "
        f"event AS ({insert_json_rows(TaskEvent, 'events')} WHERE {written} "
        "RETURNING id, task_id, seq) "
        f"SELECT e.id, e.task_id, e.seq, s.id, s.created_at{wake} "
        "FROM event e LEFT JOIN saved s ON s.task_id = e.task_id"
    )


def _tables() -> dict[str, str]:
    return {
        "dispatch": ExecutorDispatch._meta.db_table,
        "task": Task._meta.db_table,
        "agent": Agent._meta.db_table,
        "event": TaskEvent._meta.db_table,
    }


# Which pending dispatch a claim takes: the one named, or the oldest of the quick executors
# that fell due since a bound (the dispatch_due index's range: older ones are the sweeper's).
# Ordered by not_before alone, the dispatch_due index's own order (state, not_before): the
# scan stops at the first row it can lock. A tie-break on id made PostgreSQL sort a batch of
# the backlog for every claim, about 1 ms a claim under load (docs/decisions.md, fifth pass).
_CLAIM_ONE = "d.id = %(id)s AND d.state = %(pending)s AND d.not_before <= %(now)s "
_CLAIM_NEXT = (
    "d.state = %(pending)s AND d.not_before <= %(now)s AND d.not_before > %(since)s "
    "AND a.executor = ANY(%(executors)s) ORDER BY d.not_before LIMIT %(limit)s "
)


@functools.cache
def _claim_dispatch_sql(which: str = _CLAIM_ONE, quick: bool = False) -> str:
    """Lock the due pending dispatch (skip locked, the dispatch row only), then claim it, or
    mark it DONE when its task is terminal, in one statement; `quick`: each one's task row
    too (not locked) and, for a claimed one, its task's latest user message's parts (NULL
    for one marked DONE)."""
    t = _tables()
    task, task_match, parts = "", "", ""
    if quick:
        task, task_match = f", {t['task']} t", " AND t.id = x.task_id"
        parts = (
            ", CASE WHEN c.finished THEN NULL ELSE (SELECT m.parts FROM tasks_message m "
            "WHERE m.task_id = x.task_id AND m.role = %(role)s ORDER BY m.id DESC LIMIT 1) END"
            f", {columns(Task, 't')}"
        )
    return (
        "WITH c AS ("
        "SELECT d.id, a.executor, t.state = ANY(%(terminal)s) AS finished "
        f"FROM {t['dispatch']} d JOIN {t['task']} t ON t.id = d.task_id "
        f"JOIN {t['agent']} a ON a.id = t.agent_id "
        f"WHERE {which}"
        "FOR UPDATE OF d SKIP LOCKED) "
        f"UPDATE {t['dispatch']} x SET "
        "state = CASE WHEN c.finished THEN %(done)s ELSE %(claimed)s END, "
        "claims = CASE WHEN c.finished THEN x.claims ELSE x.claims + 1 END, "
        "claimed_by = CASE WHEN c.finished THEN x.claimed_by ELSE %(worker)s END, "
        "lease_expires_at = CASE WHEN c.finished THEN x.lease_expires_at ELSE %(lease)s END, "
        "updated_at = %(now)s "
        f"FROM c{task} WHERE x.id = c.id{task_match} "
        "RETURNING NOT c.finished, x.task_id, x.progress, x.lease_expires_at, c.executor, x.id"
        f"{parts}"
    )


@functools.cache
def _release_lock_sql() -> str:
    """The released dispatch's task row, locked (before the dispatch: the services' order)."""
    t = _tables()
    return (
        f"SELECT t.id, t.state, a.executor FROM {t['task']} t "
        f"JOIN {t['agent']} a ON a.id = t.agent_id "
        f"WHERE t.id = (SELECT task_id FROM {t['dispatch']} WHERE id = %(id)s) FOR UPDATE OF t"
    )


@functools.cache
def _release_sql() -> str:
    """The held claim's release. A statement of its own after the task lock: its snapshot
    sees every client message committed before that lock was granted."""
    t = _tables()
    return (
        "WITH s AS (SELECT CASE "
        "WHEN %(again)s THEN 'again' "
        "WHEN %(interrupted)s AND EXISTS ("
        f"SELECT 1 FROM {t['event']} e WHERE e.task_id = %(task)s AND e.kind = %(message)s "
        "AND e.payload -> 'message' ->> 'role' = 'ROLE_USER' AND e.seq > COALESCE(("
        f"SELECT max(l.seq) FROM {t['event']} l "
        "WHERE l.task_id = %(task)s AND l.kind = %(status)s), 0)"
        ") THEN 'input' ELSE 'done' END AS outcome) "
        f"UPDATE {t['dispatch']} d SET "
        "progress = COALESCE(%(progress)s, d.progress), "
        "lease_expires_at = NULL, "
        "state = CASE WHEN s.outcome = 'done' THEN %(done)s ELSE %(pending)s END, "
        "not_before = CASE s.outcome WHEN 'again' THEN %(again_at)s "
        "WHEN 'input' THEN %(now)s ELSE d.not_before END, "
        "enqueues = CASE WHEN s.outcome = 'done' THEN d.enqueues ELSE 1 END, "
        "updated_at = %(now)s "
        "FROM s WHERE d.id = %(id)s AND d.state = %(claimed)s AND d.claimed_by = %(worker)s "
        "RETURNING s.outcome"
    )


_PROGRESS = ExecutorDispatch._meta.get_field("progress")
_PARTS = Message._meta.get_field("parts")
_DISPATCH_STATES = {
    "pending": DispatchState.PENDING.value,
    "claimed": DispatchState.CLAIMED.value,
    "done": DispatchState.DONE.value,
}
_TERMINAL = sorted(s.value for s in TERMINAL_STATES)
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
        return DispatchRelease(rows[0][0], task_id, executor) if rows else None


# --- any database (the ORM) ----------------------------------------------------------------


class OrmTaskStore:
    """TaskStore through the ORM, on any database."""

    def claim_receipt(self, receipt: MessageReceipt) -> bool:
        try:
            with transaction.atomic():  # a savepoint: the caller's transaction goes on
                receipt.save(force_insert=True)
        except IntegrityError:
            return False
        return True

    def open_tasks(self, news: Sequence[NewTask]) -> list[bool]:
        opened = []
        with transaction.atomic():  # atomic on its own, as the one statement is
            for new in news:
                if new.receipt is not None and not self.claim_receipt(new.receipt):
                    opened.append(False)
                    continue
                for row in (new.task, new.message, new.event, new.dispatch):
                    row.save(force_insert=True)
                opened.append(True)
        return opened

    def lock(self, task_pk: uuid.UUID) -> Task | None:
        return (
            Task.objects.select_for_update(of=("self",))
            .select_related("agent")
            .filter(pk=task_pk)
            .first()
        )

    def artifact(self, task: Task, artifact_id: str) -> Artifact | None:
        return Artifact.objects.filter(task=task, artifact_id=artifact_id).first()

    def visible(self, agent_pk: int, owner: str, task_pk: uuid.UUID) -> Task | None:
        return Task.objects.filter(pk=task_pk, agent_id=agent_pk, owner=owner).first()

    def visible_snapshots(self, keys: list[SnapshotKey]) -> list[Snapshot | None]:
        found: list[Snapshot | None] = []
        for key in keys:
            task = self.visible(key.agent_pk, key.owner, key.task_pk)
            found.append(self._snapshot(task, key.history_limit) if task is not None else None)
        return found

    def settled_snapshots(
        self, keys: list[SettledKey]
    ) -> list[tuple[bool, Snapshot | None] | None]:
        return [self._settled(key) for key in keys]

    def _settled(self, key: SettledKey) -> tuple[bool, Snapshot | None] | None:
        task = self.visible(key.agent_pk, key.owner, key.task_pk)
        if task is None:
            return None
        settled = task.task_state in SETTLED_STATES and (
            key.after_seq is None
            or TaskEvent.objects.filter(
                task_id=key.task_pk, kind=EventKind.STATUS, seq__gt=key.after_seq
            ).exists()
        )
        return (True, self._snapshot(task, key.history_limit)) if settled else (False, None)

    def _snapshot(self, task: Task, history_limit: int | None) -> Snapshot:
        history = self.history(task, history_limit) if history_limit != 0 else []
        return task, history, self.artifacts(task)

    def latest_user_parts(self, task_pk: uuid.UUID) -> list | None:
        return (
            Message.objects.filter(task_id=task_pk, role=MessageRole.USER)
            .order_by("-id")
            .values_list("parts", flat=True)
            .first()
        )

    def history(self, task: Task, limit: int | None) -> list[Message]:
        newest = task.messages.order_by("-id")
        messages = list(newest[:limit] if limit is not None else newest)[::-1]
        for message in messages:
            message.task = task
        return messages

    def artifacts(self, task: Task) -> list[Artifact]:
        return list(task.artifacts.order_by("id"))

    def append_events(
        self, task: Task, events: list[TaskEvent], artifact: Artifact | None = None
    ) -> bool:
        lifecycle = {
            name: Task._meta.get_field(name).pre_save(task, False) for name in LIFECYCLE_FIELDS
        }
        # The task row first: its UPDATE locks it and checks it has not moved.
        unmoved = Task.objects.filter(pk=task.pk, last_seq=events[0].seq - 1)
        if not unmoved.update(**lifecycle):
            return False
        if artifact is not None:
            artifact.save()
        for event in events:
            event.save(force_insert=True)
        if task.task_state in TERMINAL_STATES:
            ExecutorDispatch.objects.filter(
                task_id=task.pk, state__in=ACTIVE_DISPATCH_STATES
            ).update(state=DispatchState.DONE, lease_expires_at=None, updated_at=task.updated_at)
        notify_task_event(task.pk)
        return True

    def append_events_together(self, writes: Sequence[EventsWrite]) -> set[object]:
        ordered = sorted(writes, key=lambda write: str(write[0].pk))  # a rebind's lock order
        return {task.pk for task, events, art in ordered if self.append_events(task, events, art)}

    def claim_dispatch(
        self, dispatch_id: int, worker: str, now: datetime, lease_until: datetime
    ) -> DispatchClaimRow | None:
        due = ExecutorDispatch.objects.filter(
            pk=dispatch_id, state=DispatchState.PENDING, not_before__lte=now
        )
        with transaction.atomic():  # atomic on its own, as the one statement is
            return self._claim(due, worker, lease_until)

    def claim_next_dispatches(
        self,
        executors: tuple[str, ...],
        due_since: datetime,
        worker: str,
        now: datetime,
        lease_until: datetime,
        limit: int,
    ) -> list[DispatchClaimRow]:
        due = ExecutorDispatch.objects.filter(
            state=DispatchState.PENDING,
            not_before__lte=now,
            not_before__gt=due_since,
            task__agent__executor__in=executors,
        ).order_by("not_before")
        claimed = []
        with transaction.atomic():  # atomic on its own, as the one statement is
            while len(claimed) < limit:
                row = self._claim(due, worker, lease_until, quick=True)
                if row is None:
                    break
                if row.claimed:
                    row = replace(row, user_parts=self.latest_user_parts(row.task_id))
                claimed.append(row)
        return claimed

    def _claim(
        self, due, worker: str, lease_until: datetime, *, quick: bool = False
    ) -> DispatchClaimRow | None:
        dispatch = (
            due.select_for_update(skip_locked=True, of=("self",))
            .select_related("task__agent")
            .first()
        )
        if dispatch is None:
            return None
        executor = dispatch.task.agent.executor
        task = dispatch.task if quick else None
        if dispatch.task.task_state in TERMINAL_STATES:
            dispatch.state = DispatchState.DONE
            dispatch.save(update_fields=["state", "updated_at"])
            return DispatchClaimRow(
                False, dispatch.task_id, dispatch.progress, None, executor, dispatch.pk, task=task
            )
        dispatch.state = DispatchState.CLAIMED
        dispatch.claims += 1
        dispatch.claimed_by = worker[:255]
        dispatch.lease_expires_at = lease_until
        dispatch.save(
            update_fields=["state", "claims", "claimed_by", "lease_expires_at", "updated_at"]
        )
        return DispatchClaimRow(
            True, dispatch.task_id, dispatch.progress, lease_until, executor, dispatch.pk, task=task
        )

    def release_dispatch(
        self,
        dispatch_id: int,
        worker: str,
        *,
        progress: dict | None,
        again_at: datetime | None,
        now: datetime,
    ) -> DispatchRelease | None:
        task_id = (
            ExecutorDispatch.objects.filter(pk=dispatch_id)
            .values_list("task_id", flat=True)
            .first()
        )
        task = self.lock(task_id) if task_id is not None else None
        if task is None:
            return None
        dispatch = (
            ExecutorDispatch.objects.select_for_update()
            .filter(pk=dispatch_id, state=DispatchState.CLAIMED, claimed_by=worker[:255])
            .first()
        )
        if dispatch is None:
            return None
        if progress is not None:
            dispatch.progress = progress
        dispatch.lease_expires_at = None
        if again_at is not None and task.task_state not in TERMINAL_STATES:
            outcome = "again"
            dispatch.not_before = again_at
        elif _client_input_pending(task):
            outcome = "input"
            dispatch.not_before = now
        else:
            outcome = "done"
        if outcome == "done":
            dispatch.state = DispatchState.DONE
        else:
            dispatch.state = DispatchState.PENDING
            dispatch.enqueues = 1
        dispatch.save(
            update_fields=[
                "progress",
                "lease_expires_at",
                "state",
                "not_before",
                "enqueues",
                "updated_at",
            ]
        )
        return DispatchRelease(outcome, task.pk, task.agent.executor)


def _client_input_pending(task: Task) -> bool:
    """The task waits for input, yet a client message came after its latest status change."""
    if task.task_state not in INTERRUPTED_STATES:
        return False
    last_status = (
        TaskEvent.objects.filter(task=task, kind=EventKind.STATUS)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return TaskEvent.objects.filter(
        task=task,
        kind=EventKind.MESSAGE,
        seq__gt=last_status or 0,
        payload__message__role="ROLE_USER",
    ).exists()


_PG = PgTaskStore()
_ORM = OrmTaskStore()


def get_task_store() -> TaskStore:
    """The task store `settings.A2A_STORE` chooses: "auto" the prepared SQL on PostgreSQL and
    the ORM elsewhere, "orm" the ORM everywhere, "postgres" the SQL (ImproperlyConfigured on
    another database)."""
    choice = settings.A2A_STORE
    if choice == "auto":
        return _PG if connection.vendor == "postgresql" else _ORM
    if choice == "orm":
        return _ORM
    if choice == "postgres":
        if connection.vendor != "postgresql":
            raise ImproperlyConfigured(
                f"A2A_STORE=postgres needs PostgreSQL; the database is {connection.vendor}"
            )
        return _PG
    raise ImproperlyConfigured(f"A2A_STORE must be auto, orm or postgres, not {choice!r}")
