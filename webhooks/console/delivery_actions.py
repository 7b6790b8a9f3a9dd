"""Operator actions on single deliveries beyond the replay of webhooks/services.py: "retry
now" of a delivery waiting for its next try, and the replay with the reason each delivery it
left alone was left alone. Each write is one audited transaction, the outermost one.

A delivery's retry schedule lives in its row (`next_attempt_at`) and its config's head time
(`PushConfig.head_due_at`, webhooks/delivery/heads.py); "retry now" moves both to now and rings
for a pump, so the next try is claimed like any due head: in order per config, within its
endpoint's cap.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from agents.models import OperatorAction
from webhooks.delivery import heads
from webhooks.delivery.bell import ring_on_commit
from webhooks.models import REPLAYABLE_STATES, Delivery, DeliveryState
from webhooks.services import delivery_replay


@dataclass(frozen=True)
class Skipped:
    """A requested delivery the action left as it was, and why (`reason` is a stable code)."""

    id: uuid.UUID
    reason: str  # not_found | not_waiting | due | endpoint_paused | config_deleted | not_replayable
    # | notice_not_awaited
    message: str


@dataclass(frozen=True)
class ActionOutcome:
    done: list[uuid.UUID] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


@dataclass(frozen=True)
class ReplayOutcome:
    replayed: int
    requested: int
    skipped: list[Skipped]


def _retry_refusal(delivery: Delivery, now) -> Skipped | None:
    """Why a delivery cannot be retried now, or None when it can: it must be pending, have
    been tried, wait for a later try, belong to a live config and go to an endpoint that is
    not paused (a paused endpoint's deliveries wait: resume it instead)."""
    eid = delivery.event_id
    if delivery.config.deleted_at is not None:
        return Skipped(eid, "config_deleted", "its push config was deleted: nothing is sent")
    if delivery.state != DeliveryState.PENDING or delivery.attempts == 0:
        what = delivery.state if delivery.state != DeliveryState.PENDING else "pending, never tried"
        return Skipped(eid, "not_waiting", f"{what}: only a delivery waiting to retry is retried")
    if delivery.binding.endpoint.paused_at is not None:
        return Skipped(
            eid, "endpoint_paused", "its endpoint is paused: resume the endpoint to send it"
        )
    if delivery.next_attempt_at <= now:
        return Skipped(eid, "due", "already due: a pump takes it on its next claim")
    return None


def delivery_retry_now(*, event_ids: Sequence[uuid.UUID], actor: str) -> ActionOutcome:
    """Bring the next try of deliveries waiting for a retry forward to now (attempt count and
    schedule kept; only the wait is cut short). Audited with the event ids retried, in one
    transaction that locks their configs, then the deliveries; the pumps' bell rings after commit.
    Deliveries that are not waiting for a retry are reported with the reason, unchanged."""
    wanted = list(dict.fromkeys(event_ids))
    with transaction.atomic(durable=True):
        now = timezone.now()
        config_pks = heads.lock(
            Delivery.objects.filter(event_id__in=wanted).values_list("config_id", flat=True)
        )
        rows = {
            d.event_id: d
            for d in Delivery.objects.filter(event_id__in=wanted, config_id__in=config_pks)
            .select_related("config", "binding__endpoint")
            .select_for_update(of=("self",))
        }
        done, skipped = [], []
        for eid in wanted:
            delivery = rows.get(eid)
            refusal = (
                Skipped(eid, "not_found", "no such delivery")
                if delivery is None
                else _retry_refusal(delivery, now)
            )
            if refusal is None:
                done.append(eid)
            else:
                skipped.append(refusal)
        if done:
            Delivery.objects.filter(event_id__in=done).update(next_attempt_at=now)
            heads.refresh(config_pks)
            ring_on_commit()
        OperatorAction.record(
            actor, "retry_deliveries_now", {"deliveries": [str(eid) for eid in done]}
        )
    return ActionOutcome(done, skipped)


def _replay_refusal(delivery: Delivery | None, eid: uuid.UUID, replayable: bool) -> Skipped | None:
    """Why `services.delivery_replay` leaves a delivery alone, in words. Whether it does is
    `replayable` (`Delivery.objects.replayable()`, the rule itself); this only says which part
    of the rule it fails."""
    if delivery is None:
        return Skipped(eid, "not_found", "no such delivery")
    if replayable:
        return None
    if delivery.config.deleted_at is not None:
        return Skipped(eid, "config_deleted", "its push config was deleted: nothing is sent")
    if delivery.state not in REPLAYABLE_STATES:
        return Skipped(
            eid,
            "not_replayable",
            f"{delivery.state}: only dead-lettered or delivered deliveries are replayed",
        )
    return Skipped(
        eid,
        "notice_not_awaited",
        "a rebind notice whose move no longer waits for it (moved, aborted, cut over): "
        "it would announce a channel that is not coming",
    )


def delivery_replay_explained(*, event_ids: Sequence[uuid.UUID], actor: str) -> ReplayOutcome:
    """`services.delivery_replay` of these deliveries (the one replay; audited there), with
    each one it leaves alone by its rule and why. The reasons are read just before the replay:
    a delivery that changed in between is not counted in `replayed` and is not explained."""
    wanted = list(dict.fromkeys(event_ids))
    rows = {
        d.event_id: d for d in Delivery.objects.filter(event_id__in=wanted).select_related("config")
    }
    replayable = set(
        Delivery.objects.filter(event_id__in=wanted).replayable().values_list("event_id", flat=True)
    )
    skipped = [
        s
        for eid in wanted
        if (s := _replay_refusal(rows.get(eid), eid, eid in replayable)) is not None
    ]
    refused = {s.id for s in skipped}
    pks = [rows[eid].pk for eid in wanted if eid not in refused]
    replayed = delivery_replay(delivery_pks=pks, actor=actor)
    return ReplayOutcome(replayed=replayed, requested=len(wanted), skipped=skipped)
