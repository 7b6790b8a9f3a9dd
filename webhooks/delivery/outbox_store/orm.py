"""`OrmOutboxStore`: the outbox store through the ORM, on any database: the embedded SQLite
database of `make run`, and PostgreSQL behind a transaction-pooling proxy that cannot keep
prepared statements."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.db.models import Count, F

from webhooks.delivery import heads
from webhooks.delivery.outbox_store.base import (
    AttemptResult,
    Head,
    NewAttempt,
    OutboxEvent,
    Recorded,
)
from webhooks.models import (
    AttemptOutcome,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    PushBinding,
    PushConfig,
)


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
                "task__agent_id", "task__traceparent", "task__tracestate",
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
                traceparent=row[19] or "",
                tracestate=row[20] or "",
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
        # started_at - the delivery's created_at: how long the event waited for this try.
        waited = {
            pk: (started - created).total_seconds() * 1_000_000
            for pk, started, created in DeliveryAttempt.objects.filter(
                pk__in=[r.attempt_pk for r in results]
            ).values_list("pk", "started_at", "delivery__created_at")
        }
        for r in results:
            latency = None
            if r.outcome == AttemptOutcome.DELIVERED and r.attempt_pk in waited:
                latency = round(waited[r.attempt_pk] + (r.duration_ms or 0) * 1000)
            DeliveryAttempt.objects.filter(pk=r.attempt_pk).update(
                duration_ms=r.duration_ms,
                status=r.status,
                error_class=r.error_class,
                response_excerpt=r.excerpt,
                error_detail=r.detail[:300],
                outcome=r.outcome,
                latency_us=latency,
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
