"""Retention: nothing grows forever. Batched deletes of old delivered rows and old events."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.services import metric_base_add
from tasks.models import TaskEvent
from tasks.selectors import transition_tallies
from tasks.states import TERMINAL_VALUES
from webhooks.models import Delivery, DeliveryAttempt, DeliveryState
from webhooks.selectors import Tallies, attempt_tallies


@dataclass(frozen=True)
class Purged:
    deliveries: int
    events: int


def _batched_delete(queryset, batch: int, tally: Callable[[list], Tallies]) -> int:
    """Delete what `queryset` selects, `batch` rows per statement (each batch its own short
    transaction), until nothing is left. Each batch's `tally` (the counters its rows count
    toward) is added to agents.MetricBase in the transaction that deletes them, so the
    metrics' counters never go down (a2a_platform/metrics.py). Not a fixed number of
    batches per run: at 100 batches of 5,000, a table getting more than 500,000 eligible
    rows an hour (~140/s, well below a worker's delivery rate) would never be caught up."""
    total = 0
    while True:
        with transaction.atomic():
            # Locked: an operator's replay cannot re-open a row between its count and delete.
            pks = list(
                queryset.select_for_update(of=("self",)).values_list("pk", flat=True)[:batch]
            )
            if not pks:
                return total
            metric_base_add(tally(pks))
            queryset.model.objects.filter(pk__in=pks).delete()
        total += len(pks)
        if len(pks) < batch:
            return total  # that was the last of them


def _delivery_tallies(pks: list) -> Tallies:
    """What a batch of deliveries' attempts (deleted with them) count toward."""
    return attempt_tallies(DeliveryAttempt.objects.filter(delivery_id__in=pks))


def _event_tallies(pks: list) -> Tallies:
    return transition_tallies(TaskEvent.objects.filter(pk__in=pks))


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
        _delivery_tallies,
    )
    events = _batched_delete(
        TaskEvent.objects.filter(created_at__lt=cutoff, task__state__in=TERMINAL_VALUES).order_by(
            "pk"
        ),
        batch,
        _event_tallies,
    )
    return Purged(deliveries, events)
