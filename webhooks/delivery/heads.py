"""Each push config's head: its oldest open delivery, and when that is due.

`PushConfig.head_due_at` is the delivery queue's index: a claim takes the configs whose head
is due off it, longest-waiting first, whatever the backlog behind each head. It is kept in
the same transactions that change what a config owes, always locking config rows before
delivery rows (in id order when several), so claims, records, writers and operators never
wait on each other in a cycle:

- a write that owes a new delivery (`owe`): due now, unless a head is already scheduled;
- a claim: the lease's end for a claimed head, a short wait for a head at its endpoint's cap,
  NULL for a config with nothing open or whose head's endpoint is paused (parked);
- a record, a replay, a delete, an endpoint resumed (`refresh`): the head's `next_attempt_at`,
  or NULL when nothing is open. `refresh` reads the deliveries in a statement of its own, after
  the config rows are locked, so it sees every delivery a writer committed before the lock.

The sweeper re-checks the invariant (open deliveries of a config on an endpoint that is not
paused imply a head_due_at) and repairs and logs a config that breaks it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from webhooks.models import OPEN_DELIVERY_STATES, Delivery, PushConfig

logger = logging.getLogger(__name__)


def lock(config_pks: Iterable[int]) -> list[int]:
    """Lock config rows in id order (waits); returns the pks that exist."""
    return list(
        PushConfig.objects.select_for_update()
        .filter(pk__in=sorted(set(config_pks)))
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def owe(config_pks: Iterable[int], now: datetime) -> None:
    """New deliveries were written for these configs: a config with nothing scheduled is due
    now. Always writes (and so locks) the rows: a record that is recomputing a head then
    waits for this transaction, and its recomputation sees the new delivery."""
    pks = sorted(set(config_pks))
    if len(pks) > 1:
        lock(pks)
    PushConfig.objects.filter(pk__in=pks).update(head_due_at=Coalesce(F("head_due_at"), Value(now)))


def head_ids(config_pks: Iterable[int]) -> dict[int, int]:
    """{config pk: its head delivery's pk} for configs that have an open delivery (one index
    probe per config: index delivery_open_by_config)."""
    first_open = (
        Delivery.objects.filter(config_id=OuterRef("pk"), state__in=OPEN_DELIVERY_STATES)
        .order_by("id")
        .values("id")[:1]
    )
    rows = (
        PushConfig.objects.filter(pk__in=list(config_pks))
        .annotate(head=Subquery(first_open))
        .values_list("pk", "head")
    )
    return {pk: head for pk, head in rows if head is not None}


def refresh(config_pks: Iterable[int]) -> None:
    """Set each config's head_due_at from its head (NULL when nothing is open). The caller
    has the config rows locked."""
    head_due = (
        Delivery.objects.filter(config_id=OuterRef("pk"), state__in=OPEN_DELIVERY_STATES)
        .order_by("id")
        .values("next_attempt_at")[:1]
    )
    PushConfig.objects.filter(pk__in=list(config_pks)).update(head_due_at=Subquery(head_due))


def set_due(config_pks: Iterable[int], when: datetime | None) -> None:
    pks = list(config_pks)
    if pks:
        PushConfig.objects.filter(pk__in=pks).update(head_due_at=when)


def next_due_within(seconds: float, now: datetime | None = None) -> datetime | None:
    """The earliest head time within the next `seconds`, if any."""
    now = now or timezone.now()
    return (
        PushConfig.objects.filter(head_due_at__lte=now + timedelta(seconds=seconds))
        .order_by("head_due_at")
        .values_list("head_due_at", flat=True)
        .first()
    )


def repair(now: datetime | None = None, *, older_than: float = 60, limit: int = 1000) -> int:
    """Configs that owe deliveries to an endpoint that is not paused but have no head_due_at
    (a bug elsewhere would leave them unclaimed): refresh them, and say so in the log."""
    now = now or timezone.now()
    stuck = list(
        Delivery.objects.filter(
            state__in=OPEN_DELIVERY_STATES,
            config__head_due_at__isnull=True,
            binding__endpoint__paused_at__isnull=True,
            created_at__lt=now - timedelta(seconds=older_than),
        )
        .order_by()
        .values_list("config_id", flat=True)
        .distinct()[:limit]
    )
    if stuck:
        with transaction.atomic():
            refresh(lock(stuck))
        logger.warning("webhook config heads repaired", extra={"configs": stuck[:20]})
    return len(stuck)
