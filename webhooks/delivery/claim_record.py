"""Delivering the outbox: claim in a short transaction, POST outside it, record in another.

This module orchestrates the claim (`delivery_claim_batch`) and the record
(`delivery_record_many`); the pieces they use live beside it: the statements in
webhooks/delivery/outbox_store/, each config's head time in webhooks/delivery/heads.py, the
request headers and signatures in webhooks/delivery/headers.py, the in-flight caps, failure streaks
and alerts in webhooks/delivery/endpoint_health.py, and the retry decision in
webhooks/delivery/retry_policy.py (pure). The pump (webhooks/delivery/pump.py) calls both in a loop.

Per config, deliveries go strictly in order: the head (oldest open delivery) must be
delivered or dead before the next is tried. The config row is locked (SKIP LOCKED) while a
head is claimed, so two workers never claim within one config; `next_attempt_at` is pushed
forward as a lease before the send, so a worker that dies mid-send only delays the delivery
(it is claimed again once the lease passes). Retry timing lives in the database.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from webhooks.alerts import alert_raise
from webhooks.delivery import heads, retry_policy
from webhooks.delivery.bell import ring_on_commit
from webhooks.delivery.endpoint_health import (
    endpoint_health_track,
    endpoint_successes_record,
    within_endpoint_caps,
)
from webhooks.delivery.headers import SigningKeyMissing, delivery_headers, redact
from webhooks.delivery.notices import notices_delivered
from webhooks.delivery.outbox_store import (
    AttemptResult,
    Head,
    NewAttempt,
    Recorded,
    get_outbox_store,
)
from webhooks.delivery.transport import TransportResult, failure_detail
from webhooks.models import (
    AlertKind,
    AttemptOutcome,
    Delivery,
    DeliveryAttempt,
    DeliveryKind,
    DeliveryState,
    Endpoint,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeliveryClaim:
    """One claimed head: its attempt row is written and its lease taken; send it, then
    record it (`delivery_record_many`)."""

    delivery_pk: int
    config_pk: int
    attempt_pk: int
    attempt_number: int
    url: str
    body: bytes
    headers: dict[str, str]
    kind: DeliveryKind = DeliveryKind.STATUS
    binding_version: str = ""  # `{config}.v{version}`, as X-A2A-Binding-Version names it
    traceparent: str = ""  # the task's W3C trace context (Task.traceparent, Task.tracestate)
    tracestate: str = ""


@dataclass(frozen=True)
class ClaimBatch:
    """What one claim took. `exhausted` when it read fewer due configs than it could take,
    so nothing else was due (or free to claim) as it looked."""

    claims: tuple[DeliveryClaim, ...] = ()
    exhausted: bool = True


def retry_schedule() -> list[float]:
    return [float(x) for x in settings.A2A_WEBHOOK_RETRY_SCHEDULE]


def auth_retry_schedule() -> list[float]:
    return [float(x) for x in settings.A2A_WEBHOOK_AUTH_RETRY_SCHEDULE]


@contextlib.contextmanager
def relaxed_commits():
    """Within the block, this connection's commits need not wait for the WAL flush
    (PostgreSQL). For the pump's claims and records only: a crash that loses one re-sends the
    delivery with the same webhook-id (at-least-once), while the outbox rows themselves are
    written by other transactions with a durable commit. Restored on the way out, so the
    pooled connection goes back durable."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO OFF")
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute("RESET synchronous_commit")
        except DatabaseError:
            connection.close()  # never hand a relaxed session back to the pool


def delivery_claim_batch(*, limit: int, config_pks: Iterable[int] | None = None) -> ClaimBatch:
    """Claim up to `limit` due heads, at most one per config, in one short transaction.

    Configs whose head is due are locked with SKIP LOCKED as they are read off their index
    (webhooks/delivery/heads.py), so two claimers never interleave one config. Skipped without
    spending a try: configs another claimer has locked; heads of endpoints at their in-flight
    cap or of failing endpoints another claimer has locked (looked at again after a short
    wait); heads of paused endpoints (parked until the endpoint resumes); heads of an agent
    without a live signing key (`SigningKeyMissing`: never sent unsigned; looked at again a
    sweep interval later, logged and alerted as `signing_key_missing` each time, delivered once
    a key exists).

    On PostgreSQL: a read that locks, (for failing endpoints only) a lock of those endpoints,
    and one write (webhooks/delivery/outbox_store/)."""
    now = timezone.now()
    outbox = get_outbox_store()
    with transaction.atomic(durable=True):  # the pump's: never inside another transaction
        rows = outbox.claim_read(now, limit, config_pks)
        if not rows:
            return ClaimBatch()
        due: dict[int, datetime | None] = {}
        ready = []
        for head in rows:
            if head.pk is None or head.paused:
                due[head.config_pk] = None  # nothing owed, or parked until the endpoint resumes
            elif head.next_attempt_at > now:
                due[head.config_pk] = head.next_attempt_at
            else:
                ready.append(head)
        chosen = within_endpoint_caps(ready)
        # The others step back in the due order (no try spent), or the longest-waiting heads
        # of one saturated endpoint would fill every batch: briefly behind a busy endpoint, a
        # sweep interval behind a failing one (its one try in flight decides). The pump that
        # stepped them back looks again, or leaves a timed ring when it stops.
        busy_wait = timedelta(seconds=settings.A2A_WEBHOOK_CAP_WAIT_SECONDS)
        failing_wait = timedelta(seconds=settings.A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS)
        chosen_pks = {head.pk for head in chosen}
        for head in ready:
            if head.pk not in chosen_pks:
                wait = failing_wait if head.consecutive_failures else busy_wait
                due[head.config_pk] = now + wait
        lease = settings.A2A_WEBHOOK_TIMEOUT_SECONDS + settings.A2A_WEBHOOK_LEASE_MARGIN_SECONDS
        leased_until = now + timedelta(seconds=lease)
        timestamp = int(now.timestamp())
        claims = []
        unsigned: list[tuple[Head, SigningKeyMissing]] = []
        for head in chosen:
            try:
                headers = delivery_headers(head, timestamp)
            except SigningKeyMissing as exc:
                # Never sent unsigned, no try spent: looked at again a sweep interval later.
                due[head.config_pk] = now + failing_wait
                unsigned.append((head, exc))
                continue
            due[head.config_pk] = leased_until
            claims.append((head, headers))
        if unsigned:
            _report_unsigned(unsigned)
        # The timeline numbers every attempt; `attempts` restarts at a replay, so a first try
        # that follows earlier ones is the replay's: an operator's.
        attempt_pks = outbox.claim_write(
            now,
            leased_until,
            due,
            [
                NewAttempt(
                    delivery_pk=head.pk,
                    number=head.earlier_attempts + 1,
                    url=head.url,
                    request_headers=redact(headers),
                    manual=head.earlier_attempts > 0 and head.attempts == 0,
                )
                for head, headers in claims
            ],
        )
    return ClaimBatch(
        tuple(
            DeliveryClaim(
                delivery_pk=head.pk,
                config_pk=head.config_pk,
                attempt_pk=attempt_pks[head.pk],
                attempt_number=head.attempts + 1,
                url=head.url,
                body=head.body.encode(),
                headers=headers,
                kind=DeliveryKind(head.kind),
                binding_version=f"{head.config_name}.v{head.version}",
                traceparent=head.traceparent,
                tracestate=head.tracestate,
            )
            for head, headers in claims
        ),
        exhausted=len(rows) < limit,
    )


def _report_unsigned(unsigned: list[tuple[Head, SigningKeyMissing]]) -> None:
    """Log each head kept back for want of a signing key, and raise a `signing_key_missing` alert
    on its endpoint naming the agent (`alert_raise`: one open alert per endpoint, counted
    again at each look; an operator resolves it)."""
    endpoints = Endpoint.objects.in_bulk({head.endpoint_pk for head, _ in unsigned})
    alerted = set()
    for head, exc in unsigned:
        logger.error(
            "webhooks.delivery.unsigned_held",
            extra={
                "agent": exc.slug,
                "config_id": head.config_pk,
                "event_id": str(head.event_id),
                "task_id": str(head.task_id),
            },
        )
        if (exc.agent_pk, head.endpoint_pk) in alerted:
            continue
        alerted.add((exc.agent_pk, head.endpoint_pk))
        endpoint = endpoints[head.endpoint_pk]
        alert_raise(
            AlertKind.SIGNING_KEY_MISSING,
            endpoint,
            f"agent {exc.slug!r} has no live signing key: its deliveries to {endpoint.origin} "
            "wait (nothing is sent unsigned) until one is created (signing_key_create)",
        )


class OutcomeState(StrEnum):
    """What recording one attempt decided (also the word a log or metric tags it with)."""

    DELIVERED = "delivered"
    RETRY = "retry"  # failed, tried again after `Outcome.retry_in`
    DEAD = "dead"  # failed for good: dead-lettered
    STALE = "stale"  # the lease passed and another claimer took the delivery over: not recorded


# How an attempt's row records each decision (the metrics' `outcome` label).
ATTEMPT_OUTCOMES = {
    OutcomeState.DELIVERED: AttemptOutcome.DELIVERED,
    OutcomeState.RETRY: AttemptOutcome.FAILED,
    OutcomeState.DEAD: AttemptOutcome.DEAD,
    OutcomeState.STALE: AttemptOutcome.STALE,
}

# A delivered or dead head lets its config's next delivery go.
ENDED = frozenset({OutcomeState.DELIVERED, OutcomeState.DEAD})


@dataclass(frozen=True)
class Outcome:
    state: OutcomeState
    retry_in: float | None = None
    # After this record, the config's next head is due now (a successor to claim at once).
    next_due: bool = False


def delivery_record_many(
    results: Sequence[tuple[DeliveryClaim, TransportResult]],
) -> list[Outcome]:
    """Record a batch of attempts in one short transaction, each decided on its own.

    A delivered or dead head makes its config's next delivery due: the caller (the pump)
    claims it next, or rings for a pump when it no longer claims. A retry leaves a timed ring
    hint; the time itself is in `next_attempt_at` (the sweeper finds it if the hint is lost).

    On PostgreSQL a healthy batch is three statements: lock the configs (configs before
    deliveries, as everywhere: webhooks/delivery/heads.py), read and lock the deliveries, one write.
    """
    if not results:
        return []
    now = timezone.now()
    outbox = get_outbox_store()
    config_pks = sorted({claim.config_pk for claim, _ in results})
    with transaction.atomic(durable=True):  # the pump's: never inside another transaction
        heads.lock(config_pks)
        current = outbox.record_read([claim.delivery_pk for claim, _ in results])
        outcomes: list[Outcome | None] = []
        delivered: list[tuple[int, int]] = []
        failures: list[tuple[DeliveryClaim, TransportResult]] = []
        endpoint_of: dict[int, int] = {}
        endpoint_state: dict[int, Recorded] = {}
        kinds = {claim.delivery_pk: claim.kind for claim, _ in results}
        for claim, result in results:
            row = current.get(claim.delivery_pk)
            if (
                row is None
                or row.state != DeliveryState.SENDING
                or row.attempts != claim.attempt_number
            ):
                outcomes.append(Outcome(OutcomeState.STALE))
                continue
            endpoint_of[claim.delivery_pk] = row.endpoint_pk
            endpoint_state[row.endpoint_pk] = row
            if result.ok:
                delivered.append((claim.delivery_pk, result.status))
                outcomes.append(Outcome(OutcomeState.DELIVERED))
            else:
                failures.append((claim, result))
                outcomes.append(None)  # decided below
        succeeded = {endpoint_of[pk] for pk, _ in delivered}
        failed = collections.Counter(endpoint_of[claim.delivery_pk] for claim, _ in failures)
        endpoints: dict[int, Endpoint] = {}
        if failed or any(endpoint_state[pk].consecutive_failures for pk in succeeded):
            endpoints = Endpoint.objects.in_bulk(list(endpoint_state))
        if failures:
            decided = iter(_record_failures(failures, endpoints, now))
            outcomes = [o if o is not None else next(decided) for o in outcomes]
        attempted = [
            AttemptResult(
                attempt_pk=claim.attempt_pk,
                duration_ms=result.duration_ms,
                status=result.status,
                error_class=result.error_class or "",
                excerpt=result.body_excerpt[:2000],
                detail=failure_detail(result),
                outcome=ATTEMPT_OUTCOMES[outcome.state],
            )
            for (claim, result), outcome in zip(results, outcomes, strict=True)
        ]
        notices = [pk for pk, _ in delivered if kinds[pk] == DeliveryKind.NOTICE]
        if notices:  # a rebind's notice: its config moves to the new binding now
            notices_delivered(notices, now)  # before the heads are recomputed, below
        due_now = outbox.record_write(now, attempted, delivered, config_pks)
        outcomes = [
            replace(outcome, next_due=True)
            if claim.config_pk in due_now and outcome.state in ENDED
            else outcome
            for (claim, _), outcome in zip(results, outcomes, strict=True)
        ]
        endpoint_successes_record(endpoint_state, succeeded, now)
        if endpoints:
            endpoint_health_track(endpoints, succeeded, failed, now)
        # One hint per distinct second of wait, not one per retry.
        for seconds in sorted({math.ceil(o.retry_in) for o in outcomes if o.retry_in}):
            ring_on_commit(countdown=seconds)
    return outcomes


def _record_failures(
    failures: list[tuple[DeliveryClaim, TransportResult]], endpoints: dict[int, Endpoint], now
) -> list[Outcome]:
    """Retry later or dead-letter each failed attempt (the uncommon path: ORM, row by row)."""
    deliveries = Delivery.objects.select_related("binding").in_bulk(
        [claim.delivery_pk for claim, _ in failures]
    )
    outcomes = []
    for claim, result in failures:
        delivery = deliveries[claim.delivery_pk]
        delivery.last_status = result.status
        delivery.last_error = (result.error_class or "")[:300]
        endpoint = endpoints[delivery.binding.endpoint_id]
        outcomes.append(_retry_or_dead(delivery, result, endpoint, now))
    return outcomes


def _earlier_auth_rejections(delivery: Delivery) -> int:
    """How many of this run's tries (since the delivery was created or replayed: its last
    `attempts` rows) the receiver answered 401/403. The try being recorded has no status on
    its row yet, so it is not among them."""
    statuses = (
        DeliveryAttempt.objects.filter(delivery=delivery)
        .order_by("-id")
        .values_list("status", flat=True)[: delivery.attempts]
    )
    return sum(1 for status in statuses if retry_policy.is_auth_rejection(status))


def _retry_or_dead(delivery: Delivery, result: TransportResult, endpoint: Endpoint, now) -> Outcome:
    """Write what webhooks/delivery/retry_policy.py decides for a failed try, with its alerts."""
    status = result.status
    decision = retry_policy.decide(
        status=status,
        error_class=result.error_class,
        retry_after=result.retry_after,
        attempts=delivery.attempts,
        earlier_auth_rejections=_earlier_auth_rejections(delivery),
        schedule=retry_schedule(),
        auth_schedule=auth_retry_schedule(),
    )
    if retry_policy.is_auth_rejection(status):
        alert_raise(
            AlertKind.AUTH_REJECTED,
            endpoint,
            f"{endpoint.origin} answered {status} to a signed delivery "
            f"(binding {delivery.binding_id}); the receiver may distrust our key or binding",
        )
    if isinstance(decision, retry_policy.Retry):
        delivery.state = DeliveryState.PENDING
        delivery.next_attempt_at = now + timedelta(seconds=decision.wait)
        delivery.save(update_fields=["state", "next_attempt_at", "last_status", "last_error"])
        return Outcome(OutcomeState.RETRY, decision.wait)
    delivery.state = DeliveryState.DEAD
    delivery.finished_at = now
    delivery.save(update_fields=["state", "finished_at", "last_status", "last_error"])
    alert_raise(
        AlertKind.DEAD_LETTER,
        endpoint,
        f"delivery {delivery.event_id} to {endpoint.origin} dead-lettered after "
        f"{delivery.attempts} tries (last: {status or result.error_class})",
    )
    logger.warning(
        "delivery dead-lettered",
        extra={"event_id": str(delivery.event_id), "task_id": str(delivery.task_id)},
    )
    return Outcome(OutcomeState.DEAD)
