"""The outbox store: the outbox's hot statements, declared once (`OutboxStore`), twice implemented.

webhooks/services.py and webhooks/delivery.py decide (who is owed an event, which heads go,
what an attempt's result means); a store only reads and writes the rows, inside the caller's
transaction. `OutboxStore` below is the table of contents, one docstring per statement.

`PgOutboxStore` is what production runs on PostgreSQL: each step is one prepared statement
(raw SQL; the ORM's query building and PostgreSQL's planning cost more CPU per batch than the
sends did, and three ORM statements per event were a third of a task event's CPU, measured by
bench/delivery_bench.py and a profile of task_add_artifact). Its table names, INSERT column
lists, defaults and state literals are generated from the models (`_meta`, `DeliveryState`),
as tasks/task_store.py's are, so a field added to `Delivery` or `DeliveryAttempt` cannot go
missing from a statement (building the statement refuses it). `OrmOutboxStore` does the same
through the ORM and runs on any database: the embedded SQLite database of `make run`, and
PostgreSQL behind a transaction-pooling proxy that cannot keep prepared statements.
`get_outbox_store()` picks one by `settings.A2A_STORE`. tests/integration/webhooks/
test_outbox_store.py holds both to one contract; test_outbox.py runs every service case
through both.
"""

from __future__ import annotations

import collections
import functools
import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, models
from django.db.models import Count, F

from a2a_platform.lib.sql import run_prepared
from webhooks import heads
from webhooks.models import (
    OPEN_DELIVERY_STATES,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    PushBinding,
    PushConfig,
)


class OutboxEvent(NamedTuple):
    """A task event the outbox owes its push configs: its task, seq, kind and the exact
    body."""

    task_pk: uuid.UUID
    seq: int
    kind: str
    body: str


class Head(NamedTuple):
    """A due config and its head delivery, as a claim reads them."""

    config_pk: int
    pk: int | None  # None: the config owes nothing
    event_id: uuid.UUID | None = None
    task_id: uuid.UUID | None = None
    seq: int = 0
    kind: str = ""
    body: str = ""
    attempts: int = 0
    next_attempt_at: datetime | None = None
    config_name: str = ""
    version: int = 0
    url: str = ""
    token_encrypted: str = ""
    auth_scheme: str = ""
    credentials_encrypted: str = ""
    issuer: str = ""
    endpoint_pk: int = 0
    paused: bool = False
    consecutive_failures: int = 0
    endpoint_in_flight: int = 0  # sends to this endpoint with a live lease
    agent_pk: int = 0
    earlier_attempts: int = 0


class Recorded(NamedTuple):
    """A recorded delivery as it is now (locked), with its endpoint."""

    state: str
    attempts: int
    endpoint_pk: int
    consecutive_failures: int
    last_success_at: datetime | None


class NewAttempt(NamedTuple):
    """An attempt row a claim inserts before its send."""

    delivery_pk: int
    number: int
    url: str
    request_headers: dict[str, str]
    manual: bool


class AttemptResult(NamedTuple):
    """One attempt's outcome as its row stores it (`excerpt` already truncated)."""

    attempt_pk: int
    duration_ms: float | None
    status: int | None
    error_class: str
    excerpt: str
    detail: str = ""  # the failure in words (webhooks/transport.py's failure_detail)


class OutboxStore(Protocol):
    """The outbox's statements. Each runs inside the caller's transaction and locks config
    rows before delivery rows, like every writer of heads (webhooks/heads.py)."""

    def outbox_write(self, events: Sequence[OutboxEvent], now: datetime) -> int:
        """Write one delivery of each event (each task's in seq order; of one task or of
        several) per current binding of its task's live push configs (the config rows of all
        the tasks locked in id order first), so that each config's deliveries are numbered in
        its events' order: pending, and its config due now unless its head is already
        scheduled; `held` for a binding a rebind has not activated yet. Returns how many
        configs are owed a pending delivery (each wants a pump)."""
        ...

    def claim_read(self, now: datetime, limit: int, config_pks: Iterable[int] | None) -> list[Head]:
        """Lock up to `limit` configs whose head is due (SKIP LOCKED, off the
        pushconfig_head_due index, longest-waiting first; only `config_pks` when given) and
        read each one's head with what sending it needs (binding version, endpoint state and
        in-flight count, agent, earlier attempts), ordered by the heads' due times; a config
        that owes nothing comes as `Head(config_pk, None)`."""
        ...

    def claim_write(
        self,
        now: datetime,
        leased_until: datetime,
        due: dict[int, datetime | None],
        attempts: list[NewAttempt],
    ) -> dict[int, int]:
        """Set every config's new head time (`due`), lease the attempted deliveries (sending,
        one more try, `next_attempt_at = leased_until`) and insert their attempt rows started
        at `now`. Returns {delivery pk: its new attempt's pk}."""
        ...

    def record_read(self, delivery_pks: list[int]) -> dict[int, Recorded]:
        """Lock the recorded deliveries (not their shared endpoint rows) and read their state
        and endpoint, by delivery pk."""
        ...

    def record_write(
        self,
        now: datetime,
        results: Sequence[AttemptResult],
        delivered: list[tuple[int, int]],
        config_pks: list[int],
    ) -> set[int]:
        """Write every attempt's outcome, mark the `delivered` (pk, status) deliveries
        delivered, and recompute each config's head time. Returns the configs whose new head
        is due now."""
        ...


def get_outbox_store() -> OutboxStore:
    """The store `settings.A2A_STORE` asks for: "auto" = the prepared SQL on PostgreSQL and
    the ORM elsewhere, "orm" = the ORM everywhere, "postgres" = the SQL (refused on another
    database)."""
    choice = settings.A2A_STORE
    on_postgres = connection.vendor == "postgresql"
    if choice == "orm":
        return _ORM
    if choice == "postgres":
        if not on_postgres:
            raise ImproperlyConfigured(
                f"A2A_STORE=postgres needs PostgreSQL, not {connection.vendor}"
            )
        return _PG
    return _PG if on_postgres else _ORM


# --- PostgreSQL ----------------------------------------------------------------------------


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
    # body's JSON (docs/decisions.md, "Issue 19, thirteenth pass").
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
)
UPDATE {_table(PushConfig)} p SET head_due_at = COALESCE(p.head_due_at, %(now)s)
WHERE p.id IN (SELECT config_id FROM written WHERE state = {_literal(DeliveryState.PENDING)})
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
       e.consecutive_failures, COALESCE(busy.n, 0),
       (SELECT t.agent_id FROM tasks_task t WHERE t.id = h.task_id),
       (SELECT count(*) FROM {_table(DeliveryAttempt)} x WHERE x.delivery_id = h.id)
FROM heads h
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
        response_excerpt = u.excerpt, error_detail = u.detail
    FROM unnest(%(attempts)s::bigint[], %(durations)s::float8[], %(statuses)s::int[],
                %(errors)s::text[], %(excerpts)s::text[], %(details)s::text[])
         AS u(id, duration_ms, status, error_class, excerpt, detail)
    WHERE a.id = u.id
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


def statements() -> dict[str, str]:
    """The PostgreSQL store's statements by name (what the schema-drift test reads)."""
    return {
        "outbox_write": _outbox_write_sql(),
        "claim_read": _claim_read_sql(),
        "claim_write": _claim_write_sql(),
        "record_read": _record_read_sql(),
        "record_write": _record_write_sql(),
    }


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
                "now": now,
                "delivered": [pk for pk, _ in delivered],
                "delivered_statuses": [status for _, status in delivered],
                "configs": config_pks,
            },
        )
        return {pk for pk, due in rows if due}


# --- any database (the ORM) ----------------------------------------------------------------


class OrmOutboxStore:
    """The outbox store through the ORM: the same rows on any database."""

    def outbox_write(self, events: Sequence[OutboxEvent], now: datetime) -> int:
        bindings: dict[uuid.UUID, list[tuple]] = {}
        for task_pk, *binding in PushBinding.objects.filter(
            config__task_id__in={event.task_pk for event in events},
            config__deleted_at__isnull=True,
            retired_at__isnull=True,
        ).values_list("config__task_id", "pk", "config_id", "activated_at"):
            bindings.setdefault(task_pk, []).append(tuple(binding))
        if not bindings:
            return 0
        for found in bindings.values():
            found.sort()  # in the order the SQL store numbers them: event, then binding
        Delivery.objects.bulk_create(
            Delivery(
                config_id=config_pk,
                binding_id=binding_pk,
                task_id=event.task_pk,
                seq=event.seq,
                kind=event.kind,
                body=event.body,
                next_attempt_at=now,
                # A rebind's new binding waits for its notice: held until then.
                state=DeliveryState.PENDING if active else DeliveryState.HELD,
            )
            for event in events
            for binding_pk, config_pk, active in bindings.get(event.task_pk, ())
        )
        owed = sorted(
            {config_pk for found in bindings.values() for _, config_pk, active in found if active}
        )
        if owed:
            heads.owe(owed, now)
        return len(owed)

    def claim_read(self, now: datetime, limit: int, config_pks: Iterable[int] | None) -> list[Head]:
        due = PushConfig.objects.filter(head_due_at__lte=now)
        if config_pks is not None:
            due = due.filter(pk__in=list(config_pks))
        configs = dict(
            due.order_by("head_due_at", "id")
            .select_for_update(skip_locked=True)
            .values_list("pk", "config_id")[:limit]
        )
        if not configs:
            return []
        firsts = heads.head_ids(configs)
        rows = (
            Delivery.objects.filter(pk__in=list(firsts.values()))
            .order_by("next_attempt_at", "id")
            .values_list(
                "config_id", "pk", "event_id", "task_id", "seq", "kind", "body", "attempts",
                "next_attempt_at", "binding__version", "binding__url",
                "binding__token_encrypted", "binding__auth_scheme",
                "binding__credentials_encrypted", "binding__issuer", "binding__endpoint_id",
                "binding__endpoint__paused_at", "binding__endpoint__consecutive_failures",
                "task__agent_id",
            )
        )  # fmt: skip
        endpoints = {row[15] for row in rows}
        in_flight = dict(
            Delivery.objects.filter(
                binding__endpoint_id__in=endpoints,
                state=DeliveryState.SENDING,
                next_attempt_at__gt=now,
            )
            .values("binding__endpoint_id")
            .annotate(n=Count("id"))
            .values_list("binding__endpoint_id", "n")
        )
        earlier = dict(
            DeliveryAttempt.objects.filter(delivery_id__in=list(firsts.values()))
            .values("delivery_id")
            .annotate(n=Count("id"))
            .values_list("delivery_id", "n")
        )
        found = [
            Head(
                row[0], row[1], *row[2:9], configs[row[0]], *row[9:16],
                paused=row[16] is not None,
                consecutive_failures=row[17],
                endpoint_in_flight=in_flight.get(row[15], 0),
                agent_pk=row[18],
                earlier_attempts=earlier.get(row[1], 0),
            )
            for row in rows
        ]  # fmt: skip
        return found + [Head(pk, None) for pk in configs if pk not in firsts]

    def claim_write(
        self,
        now: datetime,
        leased_until: datetime,
        due: dict[int, datetime | None],
        attempts: list[NewAttempt],
    ) -> dict[int, int]:
        by_time: dict[datetime | None, list[int]] = collections.defaultdict(list)
        for config_pk, when in due.items():
            by_time[when].append(config_pk)
        for when, pks in by_time.items():
            heads.set_due(pks, when)
        Delivery.objects.filter(pk__in=[a.delivery_pk for a in attempts]).update(
            state=DeliveryState.SENDING, attempts=F("attempts") + 1, next_attempt_at=leased_until
        )
        rows = DeliveryAttempt.objects.bulk_create(
            DeliveryAttempt(
                delivery_id=a.delivery_pk,
                number=a.number,
                url=a.url,
                started_at=now,
                request_headers=a.request_headers,
                manual=a.manual,
            )
            for a in attempts
        )
        return {row.delivery_id: row.pk for row in rows}

    def record_read(self, delivery_pks: list[int]) -> dict[int, Recorded]:
        rows = (
            Delivery.objects.select_for_update(of=("self",), no_key=True)
            .filter(pk__in=delivery_pks)
            .values_list(
                "pk", "state", "attempts", "binding__endpoint_id",
                "binding__endpoint__consecutive_failures", "binding__endpoint__last_success_at",
            )
        )  # fmt: skip
        return {row[0]: Recorded(*row[1:]) for row in rows}

    def record_write(
        self,
        now: datetime,
        results: Sequence[AttemptResult],
        delivered: list[tuple[int, int]],
        config_pks: list[int],
    ) -> set[int]:
        for r in results:
            DeliveryAttempt.objects.filter(pk=r.attempt_pk).update(
                duration_ms=r.duration_ms,
                status=r.status,
                error_class=r.error_class,
                response_excerpt=r.excerpt,
                error_detail=r.detail[:300],
            )
        by_status: dict[int, list[int]] = collections.defaultdict(list)
        for pk, status in delivered:
            by_status[status].append(pk)
        for status, pks in by_status.items():
            Delivery.objects.filter(pk__in=pks).update(
                state=DeliveryState.DELIVERED, finished_at=now, last_status=status, last_error=""
            )
        heads.refresh(config_pks)
        return set(
            PushConfig.objects.filter(pk__in=config_pks, head_due_at__lte=now).values_list(
                "pk", flat=True
            )
        )


_PG = PgOutboxStore()
_ORM = OrmOutboxStore()
