"""The delivery side of a rebind's moves: what happens when a channel notice is delivered.

A drain moves a config only once its notice, a delivery on the old binding, is delivered: the
record of that attempt (webhooks/delivery/claim_record.py) calls `notices_delivered` in its
transaction, which activates the new binding and releases what was held for it. A rebind's
"move now" and a client's re-bind call `activate` directly. Nothing here runs unless a notice
was recorded or an operator moved a config; the moves themselves are made by
webhooks/rebinds/channel_moves.py.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from webhooks.delivery import heads
from webhooks.models import ChannelMove, Delivery, DeliveryState, MoveState, PushBinding


def activate(move_pks: Collection[int], now: datetime, *, refresh_heads: bool = True) -> list[int]:
    """Activate the new bindings of these moves (still waiting for their notice) and release
    their held deliveries; the moves become `moved`. Inside the caller's transaction, with
    the configs locked (heads.lock). Returns the config pks made due."""
    rows = list(
        ChannelMove.objects.filter(
            pk__in=list(move_pks), state=MoveState.NOTICE_PENDING
        ).values_list("pk", "config_id", "new_binding_id")
    )
    if not rows:
        return []
    ChannelMove.objects.filter(pk__in=[pk for pk, _, _ in rows]).update(
        state=MoveState.MOVED, finished_at=now
    )
    bindings = [binding for _, _, binding in rows if binding is not None]
    # A version is never activated after it was retired (a withdrawn or replaced one).
    PushBinding.objects.filter(
        pk__in=bindings, activated_at__isnull=True, retired_at__isnull=True
    ).update(activated_at=now)
    Delivery.objects.filter(binding_id__in=bindings, state=DeliveryState.HELD).update(
        state=DeliveryState.PENDING, next_attempt_at=now
    )
    configs = sorted({config for _, config, _ in rows})
    if refresh_heads:
        heads.refresh(configs)
    return configs


def notices_delivered(delivery_pks: Collection[int], now: datetime) -> list[int]:
    """Notices being recorded as delivered: move their configs to the new binding (a notice
    whose move was reverted, orphaned or already moved changes nothing). The caller has the
    configs locked and recomputes their heads after this (the record's one write of each
    config row: a second update of a row this transaction already updated makes PostgreSQL
    check its foreign key to the task at commit, which waits for a transition that has the
    task locked while that transition waits for the config: a deadlock). Returns the config pks."""
    pks = list(
        ChannelMove.objects.filter(
            notice_id__in=list(delivery_pks), state=MoveState.NOTICE_PENDING
        ).values_list("pk", flat=True)
    )
    return activate(pks, now, refresh_heads=False) if pks else []
