"""Endpoint health: in-flight caps at claim time, failure streaks and successes at record
time, and the alerts they raise (`endpoint_failing`, which the endpoint's next success
resolves; `auth_rejected` and `dead_letter`, which stay until an operator resolves them).
Each runs inside the claim's or the record's transaction (webhooks/delivery/claim_record.py).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F

from webhooks.alerts import alert_raise
from webhooks.delivery.outbox_store import Head, Recorded
from webhooks.models import Alert, AlertKind, Endpoint


def within_endpoint_caps(heads: list[Head]) -> list[Head]:
    """The heads that fit their endpoint's in-flight cap, longest-waiting first.

    A failing endpoint (down, hanging) gets one try in flight at a time, claimed under its row
    lock so concurrent claimers cannot overshoot: otherwise its timeouts take every sending
    thread and stall all other endpoints. Its other configs wait (no try is spent) and are
    claimed again later; a success lifts the cap."""
    failing = {head.endpoint_pk for head in heads if head.consecutive_failures}
    locked = set()
    if failing:
        locked = set(
            Endpoint.objects.select_for_update(skip_locked=True)
            .filter(pk__in=failing)
            .values_list("pk", flat=True)
        )
    in_flight = {head.endpoint_pk: head.endpoint_in_flight for head in heads}
    chosen = []
    for head in heads:
        cap = settings.A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT
        if head.consecutive_failures:
            if head.endpoint_pk not in locked:
                continue
            cap = 1
        if in_flight[head.endpoint_pk] >= cap:
            continue
        in_flight[head.endpoint_pk] += 1
        chosen.append(head)
    return chosen


def endpoint_successes_record(
    endpoint_state: dict[int, Recorded], succeeded: Iterable[int], now: datetime
) -> None:
    """Reset the failure streak and stamp the last success of the endpoints that succeeded.

    Written when it changes something (a failure streak ends) or is a second old: every
    success rewriting the shared endpoint row would serialize the batches."""
    stale = now - timedelta(seconds=1)
    touched = [
        pk
        for pk in succeeded
        if endpoint_state[pk].consecutive_failures
        or endpoint_state[pk].last_success_at is None
        or endpoint_state[pk].last_success_at < stale
    ]
    if touched:
        Endpoint.objects.filter(pk__in=touched).update(consecutive_failures=0, last_success_at=now)


def endpoint_health_track(
    endpoints: dict[int, Endpoint],
    succeeded: set[int],
    failed: collections.Counter[int],
    now: datetime,
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
            alert_raise(
                AlertKind.ENDPOINT_FAILING,
                endpoint,
                f"{endpoint.origin} failed {streak} deliveries in a row; its other deliveries "
                "go one at a time until one succeeds",
            )
