"""Delivering the outbox: claim in a short transaction, POST outside it, record in another.

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
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from a2a_platform.lib.crypto import decrypt
from a2a_platform.lib.ttl_cache import TTLCache
from agents.models import Agent, SigningKey
from agents.signing import ensure_signing_key, live_private_keys
from webhooks import heads
from webhooks.models import (
    Alert,
    AlertKind,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    OperatorAction,
    PushConfig,
)
from webhooks.outbox_store import AttemptResult, Head, NewAttempt, Recorded, get_outbox_store
from webhooks.signer import bearer_jwt, webhook_headers
from webhooks.transport import TransportResult
from webhooks.wake import wake_on_commit

logger = logging.getLogger(__name__)

SECRET_HEADERS = {"authorization", "x-a2a-notification-token"}


@dataclass(frozen=True)
class Claim:
    delivery_pk: int
    config_pk: int
    attempt_pk: int
    attempt_number: int
    url: str
    body: bytes
    headers: dict[str, str]


def retry_schedule() -> list[float]:
    return [float(x) for x in settings.A2A_WEBHOOK_RETRY_SCHEDULE]


def auth_retry_schedule() -> list[float]:
    return [float(x) for x in settings.A2A_WEBHOOK_AUTH_RETRY_SCHEDULE]


class _Signer(NamedTuple):
    keys: list  # the agent's live private keys, the active one first
    slug: str  # the JWT issuer when the binding names none


# Per process: a key created, rotated or retired elsewhere signs (or stops) here within
# A2A_SIGNING_KEY_CACHE_SECONDS; in this process at once, on commit (below).
_signers: TTLCache[_Signer] = TTLCache(lambda: settings.A2A_SIGNING_KEY_CACHE_SECONDS)


def _signing_key_changed(sender, instance: SigningKey, using: str = "default", **_) -> None:
    agent_pk = instance.agent_id
    transaction.on_commit(lambda: _signers.discard(agent_pk), using=using)


post_save.connect(_signing_key_changed, sender=SigningKey, dispatch_uid="webhooks.signer_saved")
post_delete.connect(_signing_key_changed, sender=SigningKey, dispatch_uid="webhooks.signer_del")


def _signer(agent_pk: int) -> _Signer:
    signer = _signers.get(agent_pk)
    if signer is None:
        agent = Agent.objects.get(pk=agent_pk)
        ensure_signing_key(agent)
        signer = _signers.put(agent_pk, _Signer(live_private_keys(agent), agent.slug))
    return signer


def _headers(head: Head, now_ts: int) -> dict[str, str]:
    keys, slug = _signer(head.agent_pk)
    body = head.body.encode()
    binding_version = f"{head.config_name}.v{head.version}"
    headers = {
        "Content-Type": "application/a2a+json",
        "X-A2A-Task-Id": str(head.task_id),
        "X-A2A-Task-Seq": str(head.seq),
        "X-A2A-Binding-Version": binding_version,
        "X-A2A-Event-Kind": head.kind,
        **webhook_headers(msg_id=str(head.event_id), timestamp=now_ts, body=body, keys=keys),
    }
    if head.token_encrypted:
        headers["X-A2A-Notification-Token"] = decrypt(head.token_encrypted)
    if head.auth_scheme:
        credentials = decrypt(head.credentials_encrypted) if head.credentials_encrypted else ""
        if not credentials and head.auth_scheme.lower() == "bearer" and keys:
            credentials = bearer_jwt(
                key=keys[0],
                issuer=head.issuer or slug,
                audience=head.url,
                task_id=str(head.task_id),
                event_id=str(head.event_id),
                body=body,
                seq=head.seq,
                binding_version=binding_version,
            )
        headers["Authorization"] = f"{head.auth_scheme} {credentials}".strip()
    return headers


def redact(headers: dict[str, str]) -> dict[str, str]:
    return {k: ("<redacted>" if k.lower() in SECRET_HEADERS else v) for k, v in headers.items()}


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


class Claims(list[Claim]):
    """A claim's heads; `exhausted` when it read fewer due configs than it could take, so
    nothing else was due (or free to claim) as it looked."""

    exhausted: bool = True


def delivery_claim_batch(*, limit: int, config_pks: Iterable[int] | None = None) -> Claims:
    """Claim up to `limit` due heads, at most one per config, in one short transaction.

    Configs whose head is due are locked with SKIP LOCKED as they are read off their index
    (webhooks/heads.py), so two claimers never interleave one config. Skipped without spending
    a try: configs another claimer holds; heads of endpoints at their in-flight cap or of
    failing endpoints another claimer holds (looked at again after a short wait); heads of
    paused endpoints (parked until the endpoint resumes).

    On PostgreSQL: a read that locks, (for failing endpoints only) a lock of those endpoints,
    and one write (webhooks/outbox_store.py)."""
    now = timezone.now()
    outbox = get_outbox_store()
    with transaction.atomic():
        rows = outbox.claim_read(now, limit, config_pks)
        if not rows:
            return Claims()
        due: dict[int, datetime | None] = {}
        ready = []
        for head in rows:
            if head.pk is None or head.paused:
                due[head.config_pk] = None  # nothing owed, or parked until the endpoint resumes
            elif head.next_attempt_at > now:
                due[head.config_pk] = head.next_attempt_at
            else:
                ready.append(head)
        chosen = _within_endpoint_caps(ready)
        # The others step back in the due order (no try spent), or the longest-waiting heads
        # of one saturated endpoint would fill every batch: briefly behind a busy endpoint, a
        # sweep interval behind a failing one (its one try in flight decides). The pump that
        # stepped them back looks again, or leaves a timed wake-up when it stops.
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
        for head in chosen:
            due[head.config_pk] = leased_until
            claims.append((head, _headers(head, timestamp)))
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
    claimed = Claims(
        Claim(
            delivery_pk=head.pk,
            config_pk=head.config_pk,
            attempt_pk=attempt_pks[head.pk],
            attempt_number=head.attempts + 1,
            url=head.url,
            body=head.body.encode(),
            headers=headers,
        )
        for head, headers in claims
    )
    claimed.exhausted = len(rows) < limit
    return claimed


def _within_endpoint_caps(heads: list[Head]) -> list[Head]:
    """The heads that fit their endpoint's in-flight cap, longest-waiting first.

    A failing endpoint (down, hanging) gets one try in flight at a time, claimed under its row
    lock so concurrent claimers cannot overshoot: otherwise its timeouts take every sending
    thread and stall all other endpoints. Its other configs wait (no try is spent) and are
    claimed again later; a success lifts the cap."""
    failing = {head.endpoint_pk for head in heads if head.consecutive_failures}
    held = set()
    if failing:
        held = set(
            Endpoint.objects.select_for_update(skip_locked=True)
            .filter(pk__in=failing)
            .values_list("pk", flat=True)
        )
    in_flight = {head.endpoint_pk: head.endpoint_in_flight for head in heads}
    chosen = []
    for head in heads:
        cap = settings.A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT
        if head.consecutive_failures:
            if head.endpoint_pk not in held:
                continue
            cap = 1
        if in_flight[head.endpoint_pk] >= cap:
            continue
        in_flight[head.endpoint_pk] += 1
        chosen.append(head)
    return chosen


def delivery_claim_head(*, config_pk: int) -> Claim | None:
    """Claim the head delivery of one config, or None (nothing due, in flight, paused, the
    endpoint at its in-flight cap, or another claimer holds the config)."""
    claims = delivery_claim_batch(limit=1, config_pks=[config_pk])
    return claims[0] if claims else None


def _jitter(seconds: float) -> float:
    return seconds * random.uniform(0.8, 1.2)  # noqa: S311 (not cryptographic)


def _alert(kind: str, endpoint: Endpoint, message: str) -> None:
    alert = Alert.objects.filter(kind=kind, endpoint=endpoint, resolved_at__isnull=True).first()
    if alert is None:
        Alert.objects.create(kind=kind, endpoint=endpoint, message=message[:500])
    else:
        Alert.objects.filter(pk=alert.pk).update(
            count=F("count") + 1, message=message[:500], last_seen_at=timezone.now()
        )


def _track_endpoint_health(
    endpoints: dict[int, Endpoint],
    succeeded: set[int],
    failed: collections.Counter[int],
    now,
) -> None:
    """Count failures per endpoint; an endpoint failing `A2A_WEBHOOK_ENDPOINT_FAILING_AFTER`
    times in a row raises an `endpoint_failing` alert, which its next success resolves (the
    condition is over; dead-letter and auth alerts stay until an operator acts)."""
    recovered = [pk for pk in succeeded if endpoints[pk].consecutive_failures and pk not in failed]
    if recovered:
        Alert.objects.filter(
            kind=AlertKind.ENDPOINT_FAILING, endpoint_id__in=recovered, resolved_at__isnull=True
        ).update(resolved_at=now)
    threshold = settings.A2A_WEBHOOK_ENDPOINT_FAILING_AFTER
    for endpoint_pk, count in failed.items():
        Endpoint.objects.filter(pk=endpoint_pk).update(
            consecutive_failures=F("consecutive_failures") + count, last_failure_at=now
        )
        endpoint = endpoints[endpoint_pk]
        streak = (0 if endpoint_pk in succeeded else endpoint.consecutive_failures) + count
        if streak >= threshold:
            _alert(
                AlertKind.ENDPOINT_FAILING,
                endpoint,
                f"{endpoint.origin} failed {streak} deliveries in a row; its other deliveries "
                "go one at a time until one succeeds",
            )


@dataclass(frozen=True)
class Outcome:
    state: str  # delivered | retry | dead | stale
    retry_in: float | None = None
    # After this record, the config's next head is due now (a successor to claim at once).
    next_due: bool = False


def delivery_record(*, claim: Claim, result: TransportResult) -> Outcome:
    """Record one attempt's result and decide: delivered, retry later, or dead-letter."""
    return delivery_record_many([(claim, result)])[0]


def delivery_record_many(results: Sequence[tuple[Claim, TransportResult]]) -> list[Outcome]:
    """Record a batch of attempts in one short transaction, each decided on its own.

    A delivered or dead head makes its config's next delivery due: the caller (the pump)
    claims it next, or wakes a pump when it no longer claims. A retry leaves a timed wake-up
    hint; the time itself is in `next_attempt_at` (the sweeper finds it if the hint is lost).

    On PostgreSQL a healthy batch is three statements: lock the configs (configs before
    deliveries, as everywhere: webhooks/heads.py), read and lock the deliveries, one write.
    """
    if not results:
        return []
    now = timezone.now()
    outbox = get_outbox_store()
    config_pks = sorted({claim.config_pk for claim, _ in results})
    with transaction.atomic():
        heads.lock(config_pks)
        current = outbox.record_read([claim.delivery_pk for claim, _ in results])
        outcomes: list[Outcome | None] = []
        delivered: list[tuple[int, int]] = []
        failures: list[tuple[Claim, TransportResult]] = []
        endpoint_of: dict[int, int] = {}
        endpoint_state: dict[int, Recorded] = {}
        for claim, result in results:
            row = current.get(claim.delivery_pk)
            if (
                row is None
                or row.state != DeliveryState.SENDING
                or row.attempts != claim.attempt_number
            ):
                outcomes.append(Outcome("stale"))  # the lease passed and another took over
                continue
            endpoint_of[claim.delivery_pk] = row.endpoint_pk
            endpoint_state[row.endpoint_pk] = row
            if result.ok:
                delivered.append((claim.delivery_pk, result.status))
                outcomes.append(Outcome("delivered"))
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
            )
            for claim, result in results
        ]
        due_now = outbox.record_write(now, attempted, delivered, config_pks)
        outcomes = [
            replace(outcome, next_due=True)
            if claim.config_pk in due_now and outcome.state in ("delivered", "dead")
            else outcome
            for (claim, _), outcome in zip(results, outcomes, strict=True)
        ]
        # Written when it changes something (a failure streak ends) or is a second old: every
        # success rewriting the shared endpoint row would serialize the batches.
        stale = now - timedelta(seconds=1)
        touched = [
            pk
            for pk in succeeded
            if endpoint_state[pk].consecutive_failures
            or endpoint_state[pk].last_success_at is None
            or endpoint_state[pk].last_success_at < stale
        ]
        if touched:
            Endpoint.objects.filter(pk__in=touched).update(
                consecutive_failures=0, last_success_at=now
            )
        if endpoints:
            _track_endpoint_health(endpoints, succeeded, failed, now)
        # One hint per distinct second of wait, not one per retry.
        for seconds in sorted({math.ceil(o.retry_in) for o in outcomes if o.retry_in}):
            wake_on_commit(countdown=seconds)
    return outcomes


def _record_failures(
    failures: list[tuple[Claim, TransportResult]], endpoints: dict[int, Endpoint], now
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


AUTH_REJECTED = (401, 403)


def _earlier_auth_rejections(delivery: Delivery) -> int:
    """How many of this run's tries (since the delivery was created or replayed: its last
    `attempts` rows) the receiver answered 401/403. The try being recorded has no status on
    its row yet, so it is not among them."""
    statuses = (
        DeliveryAttempt.objects.filter(delivery=delivery)
        .order_by("-id")
        .values_list("status", flat=True)[: delivery.attempts]
    )
    return sum(1 for status in statuses if status in AUTH_REJECTED)


def _retry_or_dead(delivery: Delivery, result: TransportResult, endpoint: Endpoint, now) -> Outcome:
    status = result.status
    # Auth rejections and other failures count against their own schedules: a receiver that
    # was down for hours and then rejects our signature still gets its ~10 minutes of auth
    # retries, and auth retries do not use up the outage schedule.
    rejected = _earlier_auth_rejections(delivery)
    tries = delivery.attempts - rejected  # this try included, when it is not a rejection
    if status in AUTH_REJECTED:
        tries = rejected + 1
        schedule = auth_retry_schedule()
        _alert(
            AlertKind.AUTH_REJECTED,
            endpoint,
            f"{endpoint.origin} answered {status} to a signed delivery "
            f"(binding {delivery.binding_id}); the receiver may distrust our key or binding",
        )
    elif status is None and result.error_class in ("ssrf", "request"):
        schedule = []  # the destination is unsafe or the request unbuildable: retrying won't help
    elif status is None or status >= 500 or status in (408, 429):
        schedule = retry_schedule()
    else:
        schedule = []  # other 4xx and 3xx are final
    # `tries` counts this kind's tries so far; the schedule lists the waits between tries.
    if tries <= len(schedule):
        wait = _jitter(schedule[tries - 1])
        if result.retry_after is not None:
            wait = max(wait, min(result.retry_after, 86400.0))
        delivery.state = DeliveryState.PENDING
        delivery.next_attempt_at = now + timedelta(seconds=wait)
        delivery.save(update_fields=["state", "next_attempt_at", "last_status", "last_error"])
        return Outcome("retry", wait)
    delivery.state = DeliveryState.DEAD
    delivery.finished_at = now
    delivery.save(update_fields=["state", "finished_at", "last_status", "last_error"])
    _alert(
        AlertKind.DEAD_LETTER,
        endpoint,
        f"delivery {delivery.event_id} to {endpoint.origin} dead-lettered after "
        f"{delivery.attempts} tries (last: {status or result.error_class})",
    )
    logger.warning(
        "delivery dead-lettered",
        extra={"delivery_id": str(delivery.event_id), "task_id": str(delivery.task_id)},
    )
    return Outcome("dead")


def due_configs(limit: int = 1000) -> list[int]:
    """Configs whose head is due, longest-waiting first (each once: a config has one head;
    the rows queued behind a head that waits for its retry do not count): what is waiting
    for a pump. Configs parked on a paused endpoint are not due."""
    due = PushConfig.objects.filter(head_due_at__lte=timezone.now()).order_by("head_due_at", "id")
    return list(due.values_list("pk", flat=True)[:limit])


def delivery_replay(*, delivery_pks: list[int], actor: str) -> int:
    """Re-open dead-lettered or delivered deliveries (same event id) and audit it."""
    now = timezone.now()
    replayable = Delivery.objects.filter(
        pk__in=delivery_pks,
        state__in=[DeliveryState.DEAD, DeliveryState.DELIVERED],
        # A deleted config's client asked to stop: nothing of it is sent again.
        config__deleted_at__isnull=True,
    )
    with transaction.atomic():
        config_pks = heads.lock(replayable.values_list("config_id", flat=True))
        rows = list(
            replayable.filter(config_id__in=config_pks)
            .select_for_update(of=("self",))
            .values_list("pk", "event_id")
        )
        # A replay starts a fresh retry schedule (the same event id, so receivers dedupe).
        Delivery.objects.filter(pk__in=[pk for pk, _ in rows]).update(
            state=DeliveryState.PENDING, next_attempt_at=now, finished_at=None, attempts=0
        )
        heads.refresh(config_pks)
        OperatorAction.record(
            actor, "replay_deliveries", {"deliveries": [str(event_id) for _, event_id in rows]}
        )
        if rows:
            wake_on_commit()
    return len(rows)
