"""The executor dispatch claim statements for `PgTaskStore` (tasks/task_store/postgres.py):
claim a due pending dispatch (the one named, or the quick executors' next ones) and release a
claim taken."""

from __future__ import annotations

import functools

from a2a_platform.lib.sql import columns
from tasks.models import Task
from tasks.task_store.base import ReleaseOutcome
from tasks.task_store.sql import _tables

# Which pending dispatch a claim takes: the one named, or the oldest of the quick executors
# that fell due since a bound (the dispatch_due index's range: older ones are the sweeper's).
# Ordered by not_before alone, the dispatch_due index's own order (state, not_before): the
# scan stops at the first row it can lock. A tie-break on id made PostgreSQL sort a batch of
# the backlog for every claim, about 1 ms a claim under load (docs/decisions.md, "The task store").
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
    """A claim's release. A statement of its own after the task lock: its snapshot
    sees every client message committed before that lock was granted."""
    t = _tables()
    return (
        "WITH s AS (SELECT CASE "
        f"WHEN %(again)s THEN '{ReleaseOutcome.AGAIN}' "
        "WHEN %(interrupted)s AND EXISTS ("
        f"SELECT 1 FROM {t['event']} e WHERE e.task_id = %(task)s AND e.kind = %(message)s "
        "AND e.payload -> 'message' ->> 'role' = 'ROLE_USER' AND e.seq > COALESCE(("
        f"SELECT max(l.seq) FROM {t['event']} l "
        "WHERE l.task_id = %(task)s AND l.kind = %(status)s), 0)"
        f") THEN '{ReleaseOutcome.INPUT}' ELSE '{ReleaseOutcome.DONE}' END AS outcome) "
        f"UPDATE {t['dispatch']} d SET "
        "progress = COALESCE(%(progress)s, d.progress), "
        "lease_expires_at = NULL, "
        f"state = CASE WHEN s.outcome = '{ReleaseOutcome.DONE}' THEN %(done)s "
        "ELSE %(pending)s END, "
        f"not_before = CASE s.outcome WHEN '{ReleaseOutcome.AGAIN}' THEN %(again_at)s "
        f"WHEN '{ReleaseOutcome.INPUT}' THEN %(now)s ELSE d.not_before END, "
        f"enqueues = CASE WHEN s.outcome = '{ReleaseOutcome.DONE}' THEN d.enqueues ELSE 1 END, "
        "updated_at = %(now)s "
        "FROM s WHERE d.id = %(id)s AND d.state = %(claimed)s AND d.claimed_by = %(worker)s "
        "RETURNING s.outcome"
    )
