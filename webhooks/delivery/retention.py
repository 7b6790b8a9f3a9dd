"""Retention: nothing grows forever. Batched deletes of old delivered rows and old events."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from tasks.models import TaskEvent
from tasks.states import TERMINAL_VALUES
from webhooks.models import Delivery, DeliveryState


@dataclass(frozen=True)
class Purged:
    deliveries: int
    events: int


def _batched_delete(queryset, batch: int) -> int:
    """Delete what `queryset` selects, `batch` rows per statement (each its own short
    transaction outside an atomic block), until nothing is left. Not a fixed number of
    batches per run: at 100 batches of 5,000, a table getting more than 500,000 eligible
    rows an hour (~140/s, well below a worker's delivery rate) would never be caught up."""
    total = 0
    while True:
        pks = list(queryset.values_list("pk", flat=True)[:batch])
        if not pks:
            return total
        queryset.model.objects.filter(pk__in=pks).delete()
        total += len(pks)
        if len(pks) < batch:
            return total  # that was the last of them


def purge_old_rows(*, now=None) -> Purged:
    """Delete, in batches, deliveries delivered or canceled before the retention cutoff (their
    attempts go with them) and the events of finished tasks older than it. Dead-lettered
    deliveries stay until an operator replays or removes them; live tasks keep every event
    (streams resume from them)."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.A2A_RETENTION_DAYS)
    batch = settings.A2A_RETENTION_BATCH
    deliveries = _batched_delete(
        Delivery.objects.filter(
            state__in=[DeliveryState.DELIVERED, DeliveryState.CANCELED], finished_at__lt=cutoff
        ).order_by("pk"),
        batch,
    )
    events = _batched_delete(
        TaskEvent.objects.filter(created_at__lt=cutoff, task__state__in=TERMINAL_VALUES).order_by(
            "pk"
        ),
        batch,
    )
    return Purged(deliveries, events)
