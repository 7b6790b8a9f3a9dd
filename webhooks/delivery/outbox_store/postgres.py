"""`PgOutboxStore`, what production runs on PostgreSQL: each step is one prepared statement
(raw SQL; the ORM's query building and PostgreSQL's planning cost more CPU per batch than the
sends did, and three ORM statements per event were a third of a task event's CPU, measured by
bench/delivery_bench.py and a profile of task_add_artifact). Its table names, INSERT column
lists, defaults and state literals are generated from the models (`_meta`, `DeliveryState`),
as tasks/task_store/'s are, so a field added to `Delivery` or `DeliveryAttempt` cannot go
missing from a statement (building the statement refuses it)."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.core.exceptions import ImproperlyConfigured
from django.db import models

from a2a_platform.lib.sql import run_prepared
from webhooks.delivery.outbox_store.base import (
    AttemptResult,
    Head,
    NewAttempt,
    OutboxEvent,
    Recorded,
)
from webhooks.models import (
    OPEN_DELIVERY_STATES,
    AttemptOutcome,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    PushBinding,
    PushConfig,
)


def _table(model: type[models.Model]) -> str:
    return model._meta.db_table


def _literal(value: str | int) -> str:
    """A constant (a state, a field's default) as SQL text."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(int(value))


def _default(model: type[models.Model], name: str) -> str:
    """A field's Python default as SQL text: raw SQL applies no Python default itself."""
    return _literal(model._meta.get_field(name).get_default())


_OPEN = ", ".join(_literal(state) for state in OPEN_DELIVERY_STATES)
_SENDING = _literal(DeliveryState.SENDING)


def _insert_fields(model: type[models.Model], values: dict[str, str]) -> tuple[str, str]:
    """The column list and the value list of an INSERT of `model` writing `values` ({field
    name: SQL expression}), in the model's field order. Refuses a concrete non-nullable field
    left out (the database has no default for it: the statement would fail, or write NULL)."""
    fields = [f for f in model._meta.concrete_fields if not isinstance(f, models.AutoField)]
    missing = sorted(f.name for f in fields if not f.null and f.name not in values)
    unknown = sorted(set(values) - {f.name for f in fields})
    if missing or unknown:
        raise ImproperlyConfigured(
            f"{model.__name__} insert: missing {missing or 'nothing'}, unknown {unknown or 'none'}"
        )
    named = [f for f in fields if f.name in values]
    return ", ".join(f.column for f in named), ", ".join(values[f.name] for f in named)


@functools.cache
def _outbox_write_sql() -> str:
    # The event arrays as binary parameters (`%(…)b`): the text form quotes and escapes every
    # body's JSON (docs/decisions.md, "Prepared statements and rows").
    columns, values = _insert_fields(
        Delivery,
        {
            "event_id": "gen_random_uuid()",
            "config": "b.config_id",
            "binding": "b.id",
            "task": "e.task",
            "seq": "e.seq",
            "kind": "e.kind",
            "body": "e.body",
            # A rebind's new binding waits for its notice: what it is owed meanwhile is held.
            "state": (
                f"CASE WHEN b.activated_at IS NULL THEN {_literal(DeliveryState.HELD)} "
                f"ELSE {_literal(DeliveryState.PENDING)} END"
            ),
            "attempts": _default(Delivery, "attempts"),
            "next_attempt_at": "%(now)s",
            "last_error": _default(Delivery, "last_error"),
            "created_at": "%(now)s",
        },
    )
    return f"""
WITH configs AS (
    SELECT id, task_id FROM {_table(PushConfig)}
    WHERE task_id = ANY(%(tasks)b::uuid[]) AND deleted_at IS NULL
    ORDER BY id
    FOR NO KEY UPDATE
), written AS (
    INSERT INTO {_table(Delivery)} ({columns})
    SELECT {values}
    FROM {_table(PushBinding)} b JOIN configs c ON c.id = b.config_id
    JOIN unnest(%(tasks)b::uuid[], %(seqs)b::integer[], %(kinds)b::text[], %(bodies)b::text[])
        WITH ORDINALITY AS e(task, seq, kind, body, n) ON e.task = c.task_id
    WHERE b.retired_at IS NULL
    -- Ids are taken in this order: per config, the deliveries follow the events.
    ORDER BY e.n, b.id
    RETURNING config_id, state
), released AS (
    -- Held on a binding its notice has activated since: written by a write whose statement
    -- read the binding before the activation committed (it waited for the config row, then
    -- read as it began). Released here, before the events written now can go out ahead of
    -- them, rather than only by the sweeper (channel_moves.release_late_held).
    UPDATE {_table(Delivery)} d SET state = {_literal(DeliveryState.PENDING)},
        next_attempt_at = %(now)s
    FROM {_table(PushBinding)} lb
    WHERE d.config_id IN (SELECT id FROM configs)
      AND d.state = {_literal(DeliveryState.HELD)}
      AND lb.id = d.binding_id AND lb.activated_at IS NOT NULL
    RETURNING d.config_id
)
UPDATE {_table(PushConfig)} p SET head_due_at = COALESCE(p.head_due_at, %(now)s)
WHERE p.id IN (SELECT config_id FROM written WHERE state = {_literal(DeliveryState.PENDING)})
   OR p.id IN (SELECT config_id FROM released)
RETURNING p.id
"""


@functools.cache
def _claim_read_sql() -> str:
    # The select list is `Head`'s fields, in order.
    return f"""
WITH due AS (
    SELECT id, config_id FROM {_table(PushConfig)}
    WHERE head_due_at <= %(now)s AND (%(only)s::bigint[] IS NULL OR id = ANY(%(only)s::bigint[]))
    ORDER BY head_due_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), heads AS (
    SELECT due.id AS config_pk, due.config_id AS config_name, d.id, d.event_id, d.task_id,
           d.seq, d.kind, d.body, d.attempts, d.next_attempt_at, b.version, b.url,
           b.token_encrypted, b.auth_scheme, b.credentials_encrypted, b.issuer, b.endpoint_id
    FROM due
    LEFT JOIN LATERAL (
        SELECT * FROM {_table(Delivery)} o
        WHERE o.config_id = due.id AND o.state IN ({_OPEN})
        ORDER BY o.id LIMIT 1
    ) d ON true
    LEFT JOIN {_table(PushBinding)} b ON b.id = d.binding_id
), busy AS (
    SELECT b.endpoint_id, count(*) AS n
    FROM {_table(Delivery)} s JOIN {_table(PushBinding)} b ON b.id = s.binding_id
    WHERE s.state = {_SENDING} AND s.next_attempt_at > %(now)s
      AND b.endpoint_id IN (SELECT endpoint_id FROM heads)
    GROUP BY b.endpoint_id
)
SELECT h.config_pk, h.id, h.event_id, h.task_id, h.seq, h.kind, h.body, h.attempts,
       h.next_attempt_at, h.config_name, h.version, h.url, h.token_encrypted, h.auth_scheme,
       h.credentials_encrypted, h.issuer, h.endpoint_id, e.paused_at IS NOT NULL,
       e.consecutive_failures, COALESCE(busy.n, 0), t.agent_id,
       (SELECT count(*) FROM {_table(DeliveryAttempt)} x WHERE x.delivery_id = h.id),
       t.traceparent, t.tracestate
FROM heads h
LEFT JOIN tasks_task t ON t.id = h.task_id
LEFT JOIN {_table(Endpoint)} e ON e.id = h.endpoint_id
LEFT JOIN busy ON busy.endpoint_id = h.endpoint_id
ORDER BY h.next_attempt_at, h.id
"""


@functools.cache
def _claim_write_sql() -> str:
    columns, values = _insert_fields(
        DeliveryAttempt,
        {
            "delivery": "u.delivery_id",
            "number": "u.number",
            "url": "u.url",
            "started_at": "%(now)s",
            "request_headers": "u.headers::jsonb",
            "manual": "u.manual",
            "error_class": _default(DeliveryAttempt, "error_class"),
            "error_detail": _default(DeliveryAttempt, "error_detail"),
            "response_excerpt": _default(DeliveryAttempt, "response_excerpt"),
            "outcome": _default(DeliveryAttempt, "outcome"),
        },
    )
    return f"""
WITH heads AS (
    UPDATE {_table(PushConfig)} p SET head_due_at = u.due
    FROM unnest(%(configs)s::bigint[], %(dues)s::timestamptz[]) AS u(id, due)
    WHERE p.id = u.id
), leased AS (
    UPDATE {_table(Delivery)} SET state = {_SENDING}, attempts = attempts + 1,
        next_attempt_at = %(leased_until)s
    WHERE id = ANY(%(deliveries)s::bigint[])
)
INSERT INTO {_table(DeliveryAttempt)} ({columns})
SELECT {values}
FROM unnest(%(deliveries)s::bigint[], %(numbers)s::int[], %(urls)s::text[],
            %(headers)s::text[], %(manual)s::bool[]) AS u(delivery_id, number, url, headers, manual)
RETURNING delivery_id, id
"""


# Only the deliveries are locked: locking the joined endpoint row, which every delivery to
# that receiver shares, would serialize the batches (a lock convoy, measured).
@functools.cache
def _record_read_sql() -> str:
    return f"""
SELECT d.id, d.state, d.attempts, b.endpoint_id, e.consecutive_failures, e.last_success_at
FROM {_table(Delivery)} d
JOIN {_table(PushBinding)} b ON b.id = d.binding_id
JOIN {_table(Endpoint)} e ON e.id = b.endpoint_id
WHERE d.id = ANY(%(deliveries)s::bigint[])
FOR NO KEY UPDATE OF d
"""


# The statement's snapshot still shows the heads it delivers as open, hence their exclusion
# from the head-time subquery; retries and dead-letters were written by earlier statements.
@functools.cache
def _record_write_sql() -> str:
    return f"""
WITH tried AS (
    UPDATE {_table(DeliveryAttempt)} a
    SET duration_ms = u.duration_ms, status = u.status, error_class = u.error_class,
        response_excerpt = u.excerpt, error_detail = u.detail, outcome = u.outcome,
        latency_us = CASE WHEN u.outcome = {_literal(AttemptOutcome.DELIVERED)}
            THEN round(EXTRACT(EPOCH FROM a.started_at - t.created_at) * 1000000
                       + u.duration_ms * 1000) END
    FROM unnest(%(attempts)s::bigint[], %(durations)s::float8[], %(statuses)s::int[],
                %(errors)s::text[], %(excerpts)s::text[], %(details)s::text[],
                %(outcomes)s::text[])
         AS u(id, duration_ms, status, error_class, excerpt, detail, outcome),
         {_table(Delivery)} t
    WHERE a.id = u.id AND t.id = a.delivery_id
), delivered AS (
    UPDATE {_table(Delivery)} d
    SET state = {_literal(DeliveryState.DELIVERED)}, finished_at = %(now)s,
        last_status = u.status, last_error = {_default(Delivery, "last_error")}
    FROM unnest(%(delivered)s::bigint[], %(delivered_statuses)s::int[]) AS u(id, status)
    WHERE d.id = u.id
)
UPDATE {_table(PushConfig)} p SET head_due_at = (
    SELECT o.next_attempt_at FROM {_table(Delivery)} o
    WHERE o.config_id = p.id AND o.state IN ({_OPEN})
      AND o.id <> ALL(%(delivered)s::bigint[])
    ORDER BY o.id LIMIT 1
)
WHERE p.id = ANY(%(configs)s::bigint[])
RETURNING p.id, p.head_due_at <= %(now)s
"""


class PgOutboxStore:
    """The outbox store as prepared SQL (PostgreSQL only)."""

    def outbox_write(self, events: Sequence[OutboxEvent], now: datetime) -> int:
        params = {
            "tasks": [e.task_pk for e in events],
            "seqs": [e.seq for e in events],
            "kinds": [e.kind for e in events],
            "bodies": [e.body for e in events],
            "now": now,
        }
        return len(run_prepared(_outbox_write_sql(), params))

    def claim_read(self, now: datetime, limit: int, config_pks: Iterable[int] | None) -> list[Head]:
        only = None if config_pks is None else list(config_pks)
        rows = run_prepared(_claim_read_sql(), {"now": now, "limit": limit, "only": only})
        # A config owing nothing reads as NULLs (the LEFT JOIN): `Head(config_pk, None)`.
        return [Head(*row) if row[1] is not None else Head(row[0], None) for row in rows]

    def claim_write(
        self,
        now: datetime,
        leased_until: datetime,
        due: dict[int, datetime | None],
        attempts: list[NewAttempt],
    ) -> dict[int, int]:
        rows = run_prepared(
            _claim_write_sql(),
            {
                "configs": list(due),
                "dues": list(due.values()),
                "leased_until": leased_until,
                "now": now,
                "deliveries": [a.delivery_pk for a in attempts],
                "numbers": [a.number for a in attempts],
                "urls": [a.url for a in attempts],
                "headers": [json.dumps(a.request_headers) for a in attempts],
                "manual": [a.manual for a in attempts],
            },
        )
        return dict(rows)

    def record_read(self, delivery_pks: list[int]) -> dict[int, Recorded]:
        rows = run_prepared(_record_read_sql(), {"deliveries": delivery_pks})
        return {row[0]: Recorded(*row[1:]) for row in rows}

    def record_write(
        self,
        now: datetime,
        results: Sequence[AttemptResult],
        delivered: list[tuple[int, int]],
        config_pks: list[int],
    ) -> set[int]:
        rows = run_prepared(
            _record_write_sql(),
            {
                "attempts": [r.attempt_pk for r in results],
                "durations": [r.duration_ms for r in results],
                "statuses": [r.status for r in results],
                "errors": [r.error_class for r in results],
                "excerpts": [r.excerpt for r in results],
                "details": [r.detail[:300] for r in results],
                "outcomes": [r.outcome for r in results],
                "now": now,
                "delivered": [pk for pk, _ in delivered],
                "delivered_statuses": [status for _, status in delivered],
                "configs": config_pks,
            },
        )
        return {pk for pk, due in rows if due}
