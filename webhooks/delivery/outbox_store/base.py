"""The outbox store's interface: `OutboxStore`, the outbox's hot statements declared once, one
docstring per statement, and the types its methods take and return.

webhooks/services.py and webhooks/delivery/claim_record.py decide (who is owed an event, which
heads go, what an attempt's result means); a store only reads and writes the rows, inside the
caller's transaction. Two implementations, as Django's database backends implement one set of
operations per vendor: webhooks/delivery/outbox_store/postgres.py (`PgOutboxStore`, prepared
SQL) and webhooks/delivery/outbox_store/orm.py (`OrmOutboxStore`, the ORM, on any database).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple, Protocol


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
    # The task's W3C trace context (Task.traceparent, Task.tracestate).
    traceparent: str = ""
    tracestate: str = ""


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
    detail: str = ""  # the failure in words (webhooks/delivery/transport.py's failure_detail)
    # What recording it decided (webhooks.models.AttemptOutcome); a delivered attempt's row
    # also gets its latency from the delivery's write (`DeliveryAttempt.latency_us`).
    outcome: str = ""


class OutboxStore(Protocol):
    """The outbox's statements. Each runs inside the caller's transaction and locks config
    rows before delivery rows, like every writer of heads (webhooks/delivery/heads.py)."""

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
