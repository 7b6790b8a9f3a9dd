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
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, F
from django.utils import timezone

from a2a_platform.crypto import decrypt
from a2a_platform.ttl_cache import TTLCache
from agents.signing import ensure_signing_key, live_private_keys
from webhooks import heads
from webhooks.models import (
    Alert,
    AlertKind,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    PushConfig,
)
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


_signing_keys: TTLCache[list] = TTLCache(lambda: settings.A2A_SIGNING_KEY_CACHE_SECONDS)


def _keys(agent) -> list:
    keys = _signing_keys.get(agent.pk)
    if keys is None:
        ensure_signing_key(agent)
        keys = _signing_keys.put(agent.pk, live_private_keys(agent))
    return keys


def _headers(delivery: Delivery, now_ts: int) -> dict[str, str]:
    binding = delivery.binding
    agent = delivery.task.agent
    keys = _keys(agent)
    body = delivery.body.encode()
    binding_version = f"{binding.config.config_id}.v{binding.version}"
    headers = {
        "Content-Type": "application/a2a+json",
        "User-Agent": "a2a-platform-webhooks/1",
        "X-A2A-Task-Id": str(delivery.task_id),
        "X-A2A-Task-Seq": str(delivery.seq),
        "X-A2A-Binding-Version": binding_version,
        "X-A2A-Event-Kind": delivery.kind,
        **webhook_headers(msg_id=str(delivery.event_id), timestamp=now_ts, body=body, keys=keys),
    }
    if binding.token_encrypted:
        headers["X-A2A-Notification-Token"] = decrypt(binding.token_encrypted)
    if binding.auth_scheme:
        credentials = (
            decrypt(binding.credentials_encrypted) if binding.credentials_encrypted else ""
        )
        if not credentials and binding.auth_scheme.lower() == "bearer" and keys:
            credentials = bearer_jwt(
                key=keys[0],
                issuer=binding.issuer or agent.slug,
                audience=binding.url,
                task_id=str(delivery.task_id),
                event_id=str(delivery.event_id),
                body=body,
                seq=delivery.seq,
                binding_version=binding_version,
            )
        headers["Authorization"] = f"{binding.auth_scheme} {credentials}".strip()
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


def delivery_claim_batch(*, limit: int, config_pks: Iterable[int] | None = None) -> list[Claim]:
    """Claim up to `limit` due heads, at most one per config, in one short transaction.

    Configs whose head is due are locked with SKIP LOCKED as they are read off their index
    (webhooks/heads.py), so two claimers never interleave one config. Skipped without spending
    a try: configs another claimer holds; heads of endpoints at their in-flight cap or of
    failing endpoints another claimer holds (looked at again after a short wait); heads of
    paused endpoints (parked until the endpoint resumes)."""
    now = timezone.now()
    with transaction.atomic():
        due = PushConfig.objects.filter(head_due_at__lte=now)
        if config_pks is not None:
            due = due.filter(pk__in=list(config_pks))
        configs = list(
            due.order_by("head_due_at", "id")
            .select_for_update(skip_locked=True)
            .values_list("pk", flat=True)[:limit]
        )
        if not configs:
            return []
        firsts = heads.head_ids(configs)
        found = list(
            Delivery.objects.filter(pk__in=list(firsts.values()))
            .select_related("binding", "binding__config", "binding__endpoint", "task__agent")
            .order_by("next_attempt_at", "id")
        )
        heads.set_due(set(configs) - set(firsts), None)  # nothing open: nothing scheduled
        ready = []
        for head in found:
            if head.binding.endpoint.paused_at is not None:
                heads.set_due([head.config_id], None)  # parked; resuming refreshes it
            elif head.next_attempt_at > now:
                heads.set_due([head.config_id], head.next_attempt_at)
            else:
                ready.append(head)
        chosen = _within_endpoint_caps(ready, now)
        # The others step back in the due order (no try spent), or the longest-waiting heads
        # of one saturated endpoint would fill every batch: briefly behind a busy endpoint, a
        # sweep interval behind a failing one (its one try in flight decides). The pump that
        # stepped them back looks again, or leaves a timed wake-up when it stops.
        for failing in (False, True):
            waiting = [
                head.config_id
                for head in ready
                if head not in chosen
                and bool(head.binding.endpoint.consecutive_failures) is failing
            ]
            wait = (
                settings.A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS
                if failing
                else settings.A2A_WEBHOOK_CAP_WAIT_SECONDS
            )
            heads.set_due(waiting, now + timedelta(seconds=wait))
        if not chosen:
            return []
        lease = settings.A2A_WEBHOOK_TIMEOUT_SECONDS + settings.A2A_WEBHOOK_LEASE_MARGIN_SECONDS
        leased_until = now + timedelta(seconds=lease)
        Delivery.objects.filter(pk__in=[head.pk for head in chosen]).update(
            state=DeliveryState.SENDING, attempts=F("attempts") + 1, next_attempt_at=leased_until
        )
        heads.set_due([head.config_id for head in chosen], leased_until)
        earlier = dict(
            DeliveryAttempt.objects.filter(delivery_id__in=[head.pk for head in chosen])
            .values("delivery_id")
            .annotate(n=Count("id"))
            .values_list("delivery_id", "n")
        )
        timestamp = int(now.timestamp())
        claims, attempts = [], []
        for head in chosen:
            headers = _headers(head, timestamp)
            before = earlier.get(head.pk, 0)
            attempts.append(
                DeliveryAttempt(
                    delivery=head,
                    # The timeline numbers every attempt; `attempts` restarts at a replay, so
                    # a first try that follows earlier ones is the replay's: an operator's.
                    number=before + 1,
                    url=head.binding.url,
                    started_at=now,
                    request_headers=redact(headers),
                    manual=before > 0 and head.attempts == 0,
                )
            )
            claims.append((head, headers))
        DeliveryAttempt.objects.bulk_create(attempts)
    return [
        Claim(
            delivery_pk=head.pk,
            config_pk=head.config_id,
            attempt_pk=attempt.pk,
            attempt_number=head.attempts + 1,
            url=head.binding.url,
            body=head.body.encode(),
            headers=headers,
        )
        for (head, headers), attempt in zip(claims, attempts, strict=True)
    ]


def _within_endpoint_caps(heads: list[Delivery], now) -> list[Delivery]:
    """The heads that fit their endpoint's in-flight cap, longest-waiting first.

    A failing endpoint (down, hanging) gets one try in flight at a time, claimed under its row
    lock so concurrent claimers cannot overshoot: otherwise its timeouts take every sending
    thread and stall all other endpoints. Its other configs wait (no try is spent) and are
    claimed again later; a success lifts the cap."""
    endpoints = {head.binding.endpoint_id: head.binding.endpoint for head in heads}
    failing = [pk for pk, endpoint in endpoints.items() if endpoint.consecutive_failures]
    held = set()
    if failing:
        held = set(
            Endpoint.objects.select_for_update(skip_locked=True)
            .filter(pk__in=failing)
            .values_list("pk", flat=True)
        )
    in_flight = collections.Counter(
        dict(
            Delivery.objects.filter(
                binding__endpoint_id__in=list(endpoints),
                state=DeliveryState.SENDING,
                next_attempt_at__gt=now,
            )
            .values("binding__endpoint_id")
            .annotate(n=Count("id"))
            .values_list("binding__endpoint_id", "n")
        )
    )
    chosen = []
    for head in heads:
        endpoint = endpoints[head.binding.endpoint_id]
        cap = settings.A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT
        if endpoint.consecutive_failures:
            if endpoint.pk not in held:
                continue
            cap = 1
        if in_flight[endpoint.pk] >= cap:
            continue
        in_flight[endpoint.pk] += 1
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


def delivery_record(*, claim: Claim, result: TransportResult) -> Outcome:
    """Record one attempt's result and decide: delivered, retry later, or dead-letter."""
    return delivery_record_many([(claim, result)])[0]


def delivery_record_many(results: Sequence[tuple[Claim, TransportResult]]) -> list[Outcome]:
    """Record a batch of attempts in one short transaction, each decided on its own.

    A delivered or dead head makes its config's next delivery due: the caller (the pump)
    claims it next, or wakes a pump when it no longer claims. A retry leaves a timed wake-up
    hint; the time itself is in `next_attempt_at` (the sweeper finds it if the hint is lost).
    """
    if not results:
        return []
    now = timezone.now()
    config_pks = {claim.config_pk for claim, _ in results}
    with transaction.atomic():
        heads.lock(config_pks)  # configs before deliveries, as everywhere (webhooks/heads.py)
        _write_attempt_results(results)
        # Lock only the deliveries: a plain FOR UPDATE over the join would also lock the
        # endpoint row every delivery to that receiver shares (a lock convoy, measured by
        # bench/delivery_bench.py).
        deliveries = Delivery.objects.select_for_update(of=("self",), no_key=True).select_related(
            "binding__endpoint"
        )
        by_pk = {d.pk: d for d in deliveries.filter(pk__in=[c.delivery_pk for c, _ in results])}
        outcomes: list[Outcome] = []
        delivered: list[Delivery] = []
        succeeded: set[int] = set()
        failed: collections.Counter[int] = collections.Counter()
        for claim, result in results:
            delivery = by_pk.get(claim.delivery_pk)
            if (
                delivery is None
                or delivery.state != DeliveryState.SENDING
                or delivery.attempts != claim.attempt_number
            ):
                outcomes.append(Outcome("stale"))  # the lease passed and another took over
                continue
            delivery.last_status = result.status
            delivery.last_error = (result.error_class or "")[:300]
            endpoint = delivery.binding.endpoint
            if result.ok:
                delivery.state = DeliveryState.DELIVERED
                delivery.finished_at = now
                delivered.append(delivery)
                succeeded.add(endpoint.pk)
                outcomes.append(Outcome("delivered"))
            else:
                failed[endpoint.pk] += 1
                outcomes.append(_retry_or_dead(delivery, result, endpoint, now))
        # One UPDATE per distinct status (a healthy batch: one), not Django's bulk_update,
        # whose CASE expressions cost more CPU than the sends (measured).
        by_status: dict[int | None, list[int]] = collections.defaultdict(list)
        for delivery in delivered:
            by_status[delivery.last_status].append(delivery.pk)
        for status, pks in by_status.items():
            Delivery.objects.filter(pk__in=pks).update(
                state=DeliveryState.DELIVERED, finished_at=now, last_status=status, last_error=""
            )
        endpoints = {d.binding.endpoint_id: d.binding.endpoint for d in by_pk.values()}
        # Written when it changes something (a failure streak ends) or is a second old: every
        # success rewriting the shared endpoint row would serialize the batches.
        stale = now - timedelta(seconds=1)
        touched = [
            pk
            for pk in succeeded
            if endpoints[pk].consecutive_failures
            or endpoints[pk].last_success_at is None
            or endpoints[pk].last_success_at < stale
        ]
        if touched:
            Endpoint.objects.filter(pk__in=touched).update(
                consecutive_failures=0, last_success_at=now
            )
        _track_endpoint_health(endpoints, succeeded, failed, now)
        heads.refresh(config_pks)
        # One hint per distinct second of wait, not one per retry.
        for seconds in sorted({math.ceil(o.retry_in) for o in outcomes if o.retry_in}):
            wake_on_commit(countdown=seconds)
    return outcomes


def _write_attempt_results(results: Sequence[tuple[Claim, TransportResult]]) -> None:
    """Each attempt row gets its outcome: one parameterized UPDATE run for the whole batch
    (a single pipelined round trip with psycopg)."""
    table = connection.ops.quote_name(DeliveryAttempt._meta.db_table)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET duration_ms = %s, status = %s, error_class = %s, "  # noqa: S608
            "response_excerpt = %s WHERE id = %s",
            [
                (
                    result.duration_ms,
                    result.status,
                    result.error_class or "",
                    result.body_excerpt[:2000],
                    claim.attempt_pk,
                )
                for claim, result in results
            ],
        )


def _retry_or_dead(delivery: Delivery, result: TransportResult, endpoint: Endpoint, now) -> Outcome:
    status = result.status
    if status in (401, 403):
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
    # attempts counts tries so far; the schedule lists the waits between tries.
    if delivery.attempts <= len(schedule):
        wait = _jitter(schedule[delivery.attempts - 1])
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
    from webhooks.models import OperatorAction

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
        OperatorAction.objects.create(
            actor=actor[:150],
            action="replay_deliveries",
            target={"deliveries": [str(event_id) for _, event_id in rows]},
        )
        if rows:
            wake_on_commit()
    return len(rows)
