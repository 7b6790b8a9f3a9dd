"""Alerts: one open alert per kind and subject (an endpoint, a rebind, an agent), counted up
while it stays open. Raised by the delivery record (webhooks/delivery/endpoint_health.py,
webhooks/delivery/claim_record.py), the rebind monitor (webhooks/rebinds/operations.py) and
beat's card-age check (`card_age_check`, below); resolved by the condition's end or by an
operator (webhooks/services.py `alert_resolve`)."""

from __future__ import annotations

import math

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from agents.models import Agent
from tasks.models import Task
from tasks.states import TERMINAL_VALUES
from webhooks.models import Alert, AlertKind, Endpoint


def alert_raise(kind: str, endpoint: Endpoint | None, message: str, *, rebind=None) -> None:
    """Open an alert of this kind for the endpoint (or the rebind), or count one more on the
    open one."""
    alert = Alert.objects.filter(
        kind=kind, endpoint=endpoint, rebind=rebind, resolved_at__isnull=True
    ).first()
    if alert is None:
        Alert.objects.create(kind=kind, endpoint=endpoint, rebind=rebind, message=message[:500])
    else:
        Alert.objects.filter(pk=alert.pk).update(
            count=F("count") + 1, message=message[:500], last_seen_at=timezone.now()
        )


def card_age_check() -> int:
    """Alert (`tasks_outlive_card`) for each push-enabled agent whose measured p99 task
    duration, over its last A2A_CARD_AGE_SAMPLE finished tasks, exceeds its card's max-age:
    its tasks then outlive the card a client holds, so a client may meet a rebind's notice
    holding a card that predates it. Returns how many agents were alerted."""
    alerted = 0
    sample = settings.A2A_CARD_AGE_SAMPLE
    for agent in Agent.objects.filter(push_notifications_enabled=True, enabled=True):
        spans = sorted(
            (finished - created).total_seconds()
            for created, finished in Task.objects.filter(agent=agent, state__in=TERMINAL_VALUES)
            .order_by("-status_timestamp")
            .values_list("created_at", "status_timestamp")[:sample]
        )
        if len(spans) < 20:  # too few to call a p99
            continue
        p99 = spans[math.ceil(0.99 * len(spans)) - 1]
        if p99 <= agent.card_max_age:
            continue
        message = (
            f"agent {agent.slug}: p99 task duration {p99:.0f}s (last {len(spans)} tasks) exceeds "
            f"the card's max-age {agent.card_max_age}s; raise the max-age or the rebind "
            "minimum overlap"
        )
        open_alert = Alert.objects.filter(
            kind=AlertKind.TASKS_OUTLIVE_CARD,
            message__startswith=f"agent {agent.slug}:",
            resolved_at__isnull=True,
        ).first()
        if open_alert is None:
            Alert.objects.create(kind=AlertKind.TASKS_OUTLIVE_CARD, message=message[:500])
        else:
            Alert.objects.filter(pk=open_alert.pk).update(
                count=F("count") + 1, message=message[:500], last_seen_at=timezone.now()
            )
        alerted += 1
    return alerted
