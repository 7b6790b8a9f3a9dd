"""Moving one config's channel inside a rebind's transaction: the new binding, the notice
on the old one, orphans, and what a client's own re-registration or deletion does to a move.

The delivery side (a drain's move completes when its notice is delivered) is
webhooks/delivery/notices.py; the rebind's transitions are webhooks/rebinds/operations.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from agents.card_render import PUSH_CHANNEL_URI, agent_base_url, jwks_url
from tasks import wire
from tasks.models import Task
from tasks.services import task_extension_metadata_set
from webhooks.bindings import binding_create, body_bytes, normalize_origin, snapshot_delivery
from webhooks.delivery import heads
from webhooks.errors import NoticeIncomplete
from webhooks.models import (
    OPEN_DELIVERY_STATES,
    ChannelMove,
    Delivery,
    DeliveryKind,
    DeliveryState,
    Endpoint,
    MoveState,
    PushBinding,
    PushConfig,
)

# --- moving one config (inside a rebind's transaction, task and config rows locked) --------

CHANNEL_CHANGED = "channel-changed"
CHANNEL_ORPHANED = "channel-orphaned"


def channel_name(config: PushConfig, version: int) -> str:
    """A channel version as `X-A2A-Binding-Version` names it."""
    return f"{config.config_id}.v{version}"


def jwks_url_of(binding: PushBinding, agent) -> str:
    """The agent's JWKS as the client reached it: beside the binding's issuer (the agent's
    base URL the config was registered at), else beside the agent's public URL
    (A2A_PUBLIC_BASE_URL); "" when neither is known (such a notice is never sent)."""
    if binding.issuer:
        return jwks_url(binding.issuer)
    if settings.A2A_PUBLIC_BASE_URL:
        return jwks_url(agent_base_url(agent, settings.A2A_PUBLIC_BASE_URL, at_root=False))
    return ""


def _path_prefix(url: str, prefix: str) -> str:
    return urlsplit(prefix).path if prefix else urlsplit(url).path


@dataclass(frozen=True)
class Channels:
    """What a notice names: the key ids of the old and new channel, the policy, the moved
    prefix (for the new channel's path prefix)."""

    rebind_pk: object
    policy: str
    old_key_ids: list[str]
    new_key_ids: list[str]
    new_prefix: str = ""


def notice_body(
    task: Task,
    *,
    kind: str,
    channels: Channels,
    config: PushConfig,
    old: PushBinding,
    new: PushBinding | None,
    from_seq: int,
) -> str:
    """A channel notice: a TaskStatusUpdateEvent with the task's unchanged status and the
    payload under the extension's URI (docs/webhooks-receiving.md, "Rebinds")."""
    jwks = jwks_url_of(old, task.agent)
    if kind == CHANNEL_CHANGED and not jwks:
        raise NoticeIncomplete(
            config.config_id,
            "the agent's JWKS URL is unknown (the config was registered without the agent's "
            "URL; set A2A_PUBLIC_BASE_URL)",
        )
    if kind == CHANNEL_CHANGED and not channels.new_key_ids:
        raise NoticeIncomplete(config.config_id, "no key signs on the new channel")
    payload: dict[str, Any] = {
        "notice": kind,
        "rebindId": str(channels.rebind_pk),
        "policy": channels.policy,
        "oldChannel": {
            "version": channel_name(config, old.version),
            "keyIds": channels.old_key_ids,
        },
        "fromSeq": from_seq,
    }
    if jwks:  # a final (orphaned) notice names no new keys: it is usable without it
        payload["jwksUrl"] = jwks
    if new is not None and kind == CHANNEL_CHANGED:
        payload["newChannel"] = {
            "version": channel_name(config, new.version),
            "origin": normalize_origin(new.url),
            "pathPrefix": _path_prefix(new.url, channels.new_prefix),
            "keyIds": channels.new_key_ids,
        }
    event = wire.status_update_json(task)
    event["statusUpdate"]["metadata"] = {PUSH_CHANNEL_URI: payload}
    return body_bytes(event)


def _supersede(query, reason: str, now: datetime) -> int:
    return query.update(state=DeliveryState.SUPERSEDED, last_error=reason[:300], finished_at=now)


def _replace_waiting(waiting: PushBinding | None, new: PushBinding, reason: str, now) -> None:
    """A newer move of the same config replaces one still waiting for its notice: the waiting
    binding is retired unused, its move reverted, its notice withdrawn if still open, and
    what was held for it is held for the new binding instead (never sent, so no receiver saw
    it under the waiting version)."""
    if waiting is None:
        return
    waiting.retired_at = now
    waiting.save(update_fields=["retired_at"])
    for move in ChannelMove.objects.filter(new_binding=waiting, state=MoveState.NOTICE_PENDING):
        move.state, move.finished_at = MoveState.REVERTED, now
        move.save(update_fields=["state", "finished_at"])
        if move.notice_id:
            _supersede(
                Delivery.objects.filter(pk=move.notice_id, state__in=OPEN_DELIVERY_STATES),
                reason,
                now,
            )
    Delivery.objects.filter(binding=waiting, state=DeliveryState.HELD).update(binding=new)


def _notice(task, config, old, body: str, now) -> Delivery:
    return Delivery.objects.create(
        config=config,
        binding=old,
        task=task,
        seq=task.last_seq,
        kind=DeliveryKind.NOTICE,
        body=body,
        next_attempt_at=now,
    )


def move_configs(
    *,
    rebind_pk: object,
    items: list[tuple[Task, PushConfig]],
    new_fields: Callable[[PushBinding], dict[str, Any]],
    channels: Channels,
    now: datetime,
    snapshot: bool = False,
    orphan: bool = False,
) -> list[ChannelMove]:
    """Move each (task, config) to a new binding version (`new_fields(old)`: its fields, see
    webhooks/bindings.py; not active) and announce it on the old binding: a channel-changed
    notice (drain: the move completes when it is delivered, `notices_delivered`), or with
    `orphan` a channel-orphaned final notice, the old binding's open deliveries superseded and
    the task marked orphaned (cutover: the new binding waits for an operator's re-bind).
    `snapshot`: a held snapshot opens the new channel (a client's re-registration).

    Set-based (a batch is a few statements, whatever its size), inside the caller's
    transaction with the tasks and configs locked. A config with no binding that ever took
    deliveries is skipped."""
    old_of: dict[int, PushBinding] = {}
    waiting_of: dict[int, PushBinding] = {}
    for binding in PushBinding.objects.filter(config_id__in=[c.pk for _, c in items]).order_by(
        "config_id", "version"
    ):
        if binding.activated_at is not None:
            old_of[binding.config_id] = binding  # the newest that took deliveries
        elif binding.retired_at is None:
            waiting_of[binding.config_id] = binding
    items = [(task, config) for task, config in items if config.pk in old_of]
    if not items:
        return []
    config_pks = [config.pk for _, config in items]
    PushBinding.objects.filter(
        pk__in=[old_of[pk].pk for pk in config_pks], retired_at__isnull=True
    ).update(retired_at=now)
    PushConfig.objects.filter(pk__in=config_pks).update(current_version=F("current_version") + 1)
    endpoints: dict[str, Endpoint] = {}
    rows = []
    for _, config in items:
        config.current_version += 1
        # A version still waiting (another move's, a client's re-registration) is where the
        # task was heading: the new version starts from it, not from the one it leaves.
        fields = new_fields(waiting_of.get(config.pk) or old_of[config.pk])
        origin = normalize_origin(fields["url"])
        if origin not in endpoints:
            endpoints[origin], _ = Endpoint.objects.get_or_create(origin=origin)
        rows.append(
            PushBinding(
                config=config,
                version=config.current_version,
                endpoint=endpoints[origin],
                activated_at=None,
                **fields,
            )
        )
    new_of = {binding.config_id: binding for binding in PushBinding.objects.bulk_create(rows)}
    for pk, waiting in waiting_of.items():
        if pk in new_of:
            _replace_waiting(waiting, new_of[pk], f"replaced by rebind {rebind_pk}", now)
    if orphan:
        _supersede(
            Delivery.objects.filter(
                binding_id__in=[old_of[pk].pk for pk in config_pks],
                state__in=OPEN_DELIVERY_STATES,
            ),
            f"rebind {rebind_pk} cut over",
            now,
        )
    kind = CHANNEL_ORPHANED if orphan else CHANNEL_CHANGED
    from_seq = {task.pk: task.last_seq if snapshot else task.last_seq + 1 for task, _ in items}
    notices = Delivery.objects.bulk_create(
        Delivery(
            config=config,
            binding=old_of[config.pk],
            task=task,
            seq=task.last_seq,
            kind=DeliveryKind.NOTICE,
            body=notice_body(
                task,
                kind=kind,
                channels=channels,
                config=config,
                old=old_of[config.pk],
                new=new_of[config.pk],
                from_seq=from_seq[task.pk],
            ),
            next_attempt_at=now,
        )
        for task, config in items
    )
    if snapshot:  # after the notice: a config's deliveries go in id order
        for task, config in items:
            snapshot_delivery(
                config=config, binding=new_of[config.pk], task=task, now=now, held=True
            )
    heads.refresh(config_pks)
    moves = ChannelMove.objects.bulk_create(
        ChannelMove(
            rebind_id=rebind_pk,
            config=config,
            task=task,
            old_binding=old_of[config.pk],
            new_binding=new_of[config.pk],
            notice=notice,
            state=MoveState.ORPHANED if orphan else MoveState.NOTICE_PENDING,
            from_seq=from_seq[task.pk],
            finished_at=now if orphan else None,
        )
        for (task, config), notice in zip(items, notices, strict=True)
    )
    if orphan:
        for task, config in items:
            mark_orphaned(task, config, old_of[config.pk], rebind_pk, now)
    return moves


def orphan_move(
    move: ChannelMove,
    *,
    task: Task,
    new_fields: Callable[[PushBinding], dict[str, Any]],
    channels: Channels,
    now: datetime,
) -> None:
    """Cut over a move still on the old channel (its notice undelivered, or finishing on
    old): its open deliveries there, a pending notice included, are superseded, a
    channel-orphaned final notice goes out instead, and the task is marked orphaned."""
    config = move.config
    reason = f"rebind {move.rebind_id} cut over"
    _supersede(
        Delivery.objects.filter(binding=move.old_binding, state__in=OPEN_DELIVERY_STATES),
        reason,
        now,
    )
    new = move.new_binding
    if new is None:  # finishing on old: make the binding an operator can re-bind it to
        move.old_binding.retired_at = move.old_binding.retired_at or now
        move.old_binding.save(update_fields=["retired_at"])
        config.current_version += 1
        config.save(update_fields=["current_version"])
        new = binding_create(config=config, activated_at=None, **new_fields(move.old_binding))
    body = notice_body(
        task,
        kind=CHANNEL_ORPHANED,
        channels=channels,
        config=config,
        old=move.old_binding,
        new=new,
        from_seq=task.last_seq + 1,
    )
    move.notice = _notice(task, config, move.old_binding, body, now)
    move.new_binding = new
    move.state, move.finished_at = MoveState.ORPHANED, now
    move.save(update_fields=["notice", "new_binding", "state", "finished_at"])
    heads.refresh([config.pk])
    mark_orphaned(task, config, move.old_binding, move.rebind_id, now)


def mark_orphaned(task: Task, config: PushConfig, old: PushBinding, rebind_pk, now) -> None:
    """Record on the task (metadata under the extension's URI) that this config's channel
    was cut over: GetTask, ListTasks and a stream's first Task show it."""
    entry = dict((task.metadata or {}).get(PUSH_CHANNEL_URI) or {})
    channels = [
        c for c in entry.get("orphanedChannels", []) if c.get("configId") != config.config_id
    ]
    channels.append(
        {
            "configId": config.config_id,
            "version": channel_name(config, old.version),
            "rebindId": str(rebind_pk),
            "at": wire.timestamp_json(now),
        }
    )
    task_extension_metadata_set(
        task=task, uri=PUSH_CHANNEL_URI, value={"orphaned": True, "orphanedChannels": channels}
    )


def orphan_reopen(move: ChannelMove, *, task: Task, now: datetime) -> None:
    """One orphaned move's channel opens again on its waiting version (one config of
    `operations.rebind_orphans`, the operator's action over the whole rebind): the new binding
    is activated, what was held for it since the cutover is superseded by one snapshot of the
    task as it is now, and the task's orphan mark loses this config."""
    new = move.new_binding
    _supersede(
        Delivery.objects.filter(binding=new, state=DeliveryState.HELD),
        "replaced by a snapshot when the orphan was re-bound",
        now,
    )
    new.activated_at = now
    new.save(update_fields=["activated_at"])
    snapshot_delivery(config=move.config, binding=new, task=task, now=now)
    heads.refresh([move.config_id])
    move.state, move.finished_at = MoveState.REBOUND, now
    move.save(update_fields=["state", "finished_at"])
    _unmark_orphaned(task, move.config)


def _unmark_orphaned(task: Task, config: PushConfig) -> None:
    """The task's orphan mark loses this config (and goes when none is left)."""
    entry = dict((task.metadata or {}).get(PUSH_CHANNEL_URI) or {})
    channels = entry.get("orphanedChannels", [])
    left = [c for c in channels if c.get("configId") != config.config_id]
    if len(left) == len(channels):
        return
    task_extension_metadata_set(
        task=task,
        uri=PUSH_CHANNEL_URI,
        value={"orphaned": True, "orphanedChannels": left} if left else None,
    )


def orphan_reregistered(task: Task, config: PushConfig, now: datetime) -> None:
    """The client registered an orphaned config again (same id): its registration is the
    re-bind. The cutover's waiting version is never activated (the caller retires it), what
    was held for it is superseded by the registration's snapshot, its move is `rebound` and
    the task's orphan mark loses the config. Inside the registration's transaction."""
    moves = ChannelMove.objects.filter(config=config, state=MoveState.ORPHANED)
    waiting = list(moves.exclude(new_binding=None).values_list("new_binding_id", flat=True))
    if not waiting:
        return
    _supersede(
        Delivery.objects.filter(binding_id__in=waiting, state=DeliveryState.HELD),
        "replaced by the client's re-registration of the orphaned config",
        now,
    )
    moves.update(state=MoveState.REBOUND, finished_at=now)
    _unmark_orphaned(task, config)


def config_deleted(task: Task, config: PushConfig, now: datetime) -> None:
    """The client deleted `config`: its moves still open (waiting for a notice, finishing on
    old, orphaned) end `config_deleted` and the task's orphan mark loses it, so no later
    operation (finish on old, cut over, re-bind) acts on a channel the client asked to stop,
    and a later registration of the same id starts afresh. Inside the deletion's
    transaction."""
    ChannelMove.objects.filter(
        config=config,
        state__in=[MoveState.NOTICE_PENDING, MoveState.FINISHING_ON_OLD, MoveState.ORPHANED],
    ).update(state=MoveState.CONFIG_DELETED, finished_at=now)
    _unmark_orphaned(task, config)


def release_late_held(limit: int = 1000) -> int:
    """Release held deliveries whose binding is active already: the sweeper's backstop for a
    transition that wrote its delivery as the notice's record activated the binding (on
    PostgreSQL the outbox write waits for the config row, then reads the binding as its
    statement began: not active yet). The config's next outbox write releases it first
    (outbox_store/postgres.py), so a run that goes on writing cannot overtake it; this
    releases the one a run's last event left. Returns how many were released."""
    late = list(
        Delivery.objects.filter(state=DeliveryState.HELD, binding__activated_at__isnull=False)
        .order_by("id")
        .values_list("config_id", flat=True)[:limit]
    )
    if not late:
        return 0
    configs = heads.lock(late)
    released = Delivery.objects.filter(
        config_id__in=configs, state=DeliveryState.HELD, binding__activated_at__isnull=False
    ).update(state=DeliveryState.PENDING, next_attempt_at=timezone.now())
    heads.refresh(configs)
    return released
