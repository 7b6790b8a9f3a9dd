"""The task rows' statements for `PgTaskStore` (tasks/task_store/postgres.py), generated
from the models' `_meta`: a task's lock and reads, its snapshots, opening tasks, the
idempotency receipt and the lifecycle writes (`append_events`). The dispatch claim and release
statements are tasks/task_store/claims.py's."""

from __future__ import annotations

import functools

from a2a_platform.lib.sql import columns, insert_json_rows
from agents.models import Agent
from tasks.models import Artifact, ExecutorDispatch, Message, MessageReceipt, Task, TaskEvent
from tasks.notify import CHANNEL
from tasks.task_store.base import LIFECYCLE_FIELDS


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
