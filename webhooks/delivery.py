"""Delivering the outbox: claim in a short transaction, POST outside it, record in another.

Per config, deliveries go strictly in order: the head (oldest open delivery) must be
delivered or dead before the next is tried. The config row is locked (SKIP LOCKED) while a
head is claimed, so two workers never claim within one config; `next_attempt_at` is pushed
forward as a lease before the send, so a worker that dies mid-send only delays the delivery
(it is claimed again once the lease passes). Retry timing lives in the database.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from a2a_platform.crypto import decrypt
from a2a_platform.side_effects import enqueue_on_commit
from agents.signing import ensure_signing_key, live_private_keys
from webhooks.models import (
    OPEN_DELIVERY_STATES,
    Alert,
    AlertKind,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    PushConfig,
)
from webhooks.services import DELIVER_CONFIG_JOB
from webhooks.signer import bearer_jwt, webhook_headers
from webhooks.transport import TransportResult

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


def _headers(delivery: Delivery, now_ts: int) -> dict[str, str]:
    binding = delivery.binding
    agent = delivery.task.agent
    ensure_signing_key(agent)
    keys = live_private_keys(agent)
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


def delivery_claim_head(*, config_pk: int, manual: bool = False) -> Claim | None:
    """Claim the head delivery of one config, or None (nothing due, in flight, paused,
    the endpoint at its in-flight cap, or another worker holds the config)."""
    now = timezone.now()
    with transaction.atomic():
        config = PushConfig.objects.select_for_update(skip_locked=True).filter(pk=config_pk)
        if not config.exists():
            return None
        head = (
            Delivery.objects.select_related(
                "binding", "binding__config", "binding__endpoint", "task", "task__agent"
            )
            .filter(config_id=config_pk, state__in=OPEN_DELIVERY_STATES)
            .order_by("id")
            .first()
        )
        if head is None or head.next_attempt_at > now:
            return None
        endpoint = head.binding.endpoint
        if endpoint.paused_at is not None:
            return None
        cap = settings.A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT
        if endpoint.consecutive_failures:
            # A failing endpoint (down, hanging) gets one try in flight at a time, claimed
            # under its row lock so concurrent claims cannot overshoot: otherwise its
            # timeouts take every worker thread and stall all other endpoints. The others
            # wait (no try is spent) and are swept again; a success lifts the cap.
            locked = Endpoint.objects.select_for_update(skip_locked=True).filter(pk=endpoint.pk)
            if not locked.exists():
                return None
            cap = 1
        in_flight = Delivery.objects.filter(
            binding__endpoint=endpoint, state=DeliveryState.SENDING, next_attempt_at__gt=now
        ).count()
        if in_flight >= cap:
            return None
        lease = settings.A2A_WEBHOOK_TIMEOUT_SECONDS + settings.A2A_WEBHOOK_LEASE_MARGIN_SECONDS
        head.state = DeliveryState.SENDING
        head.attempts += 1
        head.next_attempt_at = now + timedelta(seconds=lease)
        head.save(update_fields=["state", "attempts", "next_attempt_at"])
        headers = _headers(head, int(now.timestamp()))
        attempt = DeliveryAttempt.objects.create(
            delivery=head,
            # The timeline numbers every attempt; `attempts` restarts at a replay.
            number=DeliveryAttempt.objects.filter(delivery=head).count() + 1,
            url=head.binding.url,
            started_at=now,
            request_headers=redact(headers),
            manual=manual,
        )
    return Claim(
        delivery_pk=head.pk,
        config_pk=config_pk,
        attempt_pk=attempt.pk,
        attempt_number=head.attempts,
        url=head.binding.url,
        body=head.body.encode(),
        headers=headers,
    )


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


@dataclass(frozen=True)
class Outcome:
    state: str  # delivered | retry | dead | stale
    retry_in: float | None = None


def delivery_record(*, claim: Claim, result: TransportResult) -> Outcome:
    """Record one attempt's result and decide: delivered, retry later, or dead-letter."""
    now = timezone.now()
    with transaction.atomic():
        DeliveryAttempt.objects.filter(pk=claim.attempt_pk).update(
            duration_ms=result.duration_ms,
            status=result.status,
            error_class=result.error_class or "",
            response_excerpt=result.body_excerpt[:2000],
        )
        # Lock only this delivery: a plain FOR UPDATE over the join would also lock the
        # endpoint row every delivery to that receiver shares (a lock convoy, measured by
        # bench/delivery_bench.py).
        delivery = (
            Delivery.objects.select_for_update(of=("self",), no_key=True)
            .select_related("binding__endpoint")
            .get(pk=claim.delivery_pk)
        )
        if delivery.state != DeliveryState.SENDING or delivery.attempts != claim.attempt_number:
            return Outcome("stale")  # the lease passed and another worker took over
        endpoint = delivery.binding.endpoint
        delivery.last_status = result.status
        delivery.last_error = (result.error_class or "")[:300]
        if result.ok:
            delivery.state = DeliveryState.DELIVERED
            delivery.finished_at = now
            delivery.save()
            Endpoint.objects.filter(pk=endpoint.pk).update(
                consecutive_failures=0, last_success_at=now
            )
            outcome = Outcome("delivered")
        else:
            Endpoint.objects.filter(pk=endpoint.pk).update(
                consecutive_failures=F("consecutive_failures") + 1, last_failure_at=now
            )
            outcome = _retry_or_dead(delivery, result, endpoint, now)
        if outcome.state in ("delivered", "dead"):
            enqueue_on_commit(DELIVER_CONFIG_JOB, [claim.config_pk])
        elif outcome.retry_in is not None:
            enqueue_on_commit(DELIVER_CONFIG_JOB, [claim.config_pk], countdown=outcome.retry_in)
    return outcome


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
        delivery.save()
        return Outcome("retry", wait)
    delivery.state = DeliveryState.DEAD
    delivery.finished_at = now
    delivery.save()
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
    """Configs whose head is due (lost messages, dead workers, retries whose countdown message
    was lost with its worker): what the sweeper re-enqueues."""
    now = timezone.now()
    # Only a head counts (a config's oldest open delivery; one per config, so no duplicates):
    # the pending rows queued behind a head that waits for its retry are "due" too, and must
    # not fill `limit` ahead of other configs' due heads. Longest-waiting heads first.
    older_open = Delivery.objects.filter(
        config_id=OuterRef("config_id"), state__in=OPEN_DELIVERY_STATES, id__lt=OuterRef("id")
    )
    return list(
        Delivery.objects.filter(state__in=OPEN_DELIVERY_STATES, next_attempt_at__lte=now)
        .exclude(Exists(older_open))
        .order_by("next_attempt_at", "id")
        .values_list("config_id", flat=True)[:limit]
    )


def delivery_replay(*, delivery_pks: list[int], actor: str) -> int:
    """Re-open dead-lettered or delivered deliveries (same event id) and audit it."""
    from webhooks.models import OperatorAction

    now = timezone.now()
    with transaction.atomic():
        rows = list(
            Delivery.objects.select_for_update()
            .filter(pk__in=delivery_pks, state__in=[DeliveryState.DEAD, DeliveryState.DELIVERED])
            .values_list("pk", "config_id", "event_id")
        )
        # A replay starts a fresh retry schedule (the same event id, so receivers dedupe).
        Delivery.objects.filter(pk__in=[r[0] for r in rows]).update(
            state=DeliveryState.PENDING, next_attempt_at=now, finished_at=None, attempts=0
        )
        OperatorAction.objects.create(
            actor=actor[:150],
            action="replay_deliveries",
            target={"deliveries": [str(r[2]) for r in rows]},
        )
        for config_pk in {r[1] for r in rows}:
            enqueue_on_commit(DELIVER_CONFIG_JOB, [config_pk])
    return len(rows)
