"""Reads of the webhooks app: what is due, push configs' current bindings, deliveries for
the operators' API. No writes here (webhooks/services.py, webhooks/delivery.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, QuerySet
from django.utils import timezone

from agents.card_render import PUSH_CHANNEL_URI
from agents.models import Agent, SigningKey, SigningKeyState
from tasks.errors import TaskNotFound
from tasks.models import Task
from tasks.states import TERMINAL_STATES, TaskState
from webhooks.models import (
    CONFIG_ID,
    ON_OLD_MOVE_STATES,
    OPEN_REBIND_STATES,
    ChannelMove,
    Delivery,
    DeliveryState,
    MoveState,
    PushBinding,
    PushConfig,
    Rebind,
)


def due_configs(limit: int = 1000) -> list[int]:
    """Configs whose head is due, longest-waiting first (each once: a config has one head;
    the rows queued behind a head that waits for its retry do not count): what is waiting
    for a pump. Configs parked on a paused endpoint are not due."""
    due = PushConfig.objects.filter(head_due_at__lte=timezone.now()).order_by("head_due_at", "id")
    return list(due.values_list("pk", flat=True)[:limit])


def current_bindings(task: Task) -> list[PushBinding]:
    """The current binding of each live push config of the task, by config id."""
    return list(
        PushBinding.objects.select_related("config")
        .filter(config__task=task, config__deleted_at__isnull=True, retired_at__isnull=True)
        .order_by("config_id")
    )


def current_binding(task: Task, config_id: str) -> PushBinding:
    """The current binding of one live config of the task. Raises TaskNotFound."""
    if not CONFIG_ID.fullmatch(config_id):  # never stored (a NUL would not even reach SQL)
        raise TaskNotFound(task.pk)
    binding = (
        PushBinding.objects.select_related("config")
        .filter(
            config__task=task,
            config__config_id=config_id,
            config__deleted_at__isnull=True,
            retired_at__isnull=True,
        )
        .first()
    )
    if binding is None:
        raise TaskNotFound(task.pk)  # the spec has no "config not found" error (§3.1.8)
    return binding


def delivery_list(
    *,
    state: str | None = None,
    task_id: uuid.UUID | None = None,
    agent_slug: str | None = None,
    endpoint_origin: str | None = None,
) -> QuerySet[Delivery]:
    """Deliveries, newest first, with what the API renders of each, filtered by what is
    given."""
    qs = Delivery.objects.select_related(
        "task__agent", "config", "binding", "binding__endpoint"
    ).order_by("-id")
    if state is not None:
        qs = qs.filter(state=state)
    if task_id is not None:
        qs = qs.filter(task_id=task_id)
    if agent_slug is not None:
        qs = qs.filter(task__agent__slug=agent_slug)
    if endpoint_origin is not None:
        qs = qs.filter(binding__endpoint__origin=endpoint_origin)
    return qs


def delivery_by_event_id(event_id: uuid.UUID) -> Delivery | None:
    """One delivery with its attempt timeline, or None."""
    return (
        Delivery.objects.select_related("task__agent", "config", "binding__endpoint")
        .prefetch_related("attempts_log")
        .filter(event_id=event_id)
        .first()
    )


def delivery_pks(event_ids: Iterable[uuid.UUID]) -> list[int]:
    """The pks of the deliveries with these event ids (unknown ids are left out)."""
    return list(Delivery.objects.filter(event_id__in=list(event_ids)).values_list("pk", flat=True))


# --- rebinds ---------------------------------------------------------------------------------


def rebind_counts(rebind: Rebind) -> dict[str, Any]:
    """A rebind's live counts: tasks on the old version by state, moves by outcome, and its
    notices by delivery state (what the monitor stores on the row and the console shows)."""
    moves = ChannelMove.objects.filter(rebind=rebind)
    by_state = dict(moves.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    on_old = dict(
        moves.filter(state__in=ON_OLD_MOVE_STATES, config__deleted_at__isnull=True)
        .exclude(task__state__in=[s.value for s in TERMINAL_STATES])
        .values_list("task__state")
        .annotate(n=Count("id"))
        .values_list("task__state", "n")
    )
    notices = dict(
        Delivery.objects.filter(pk__in=moves.exclude(notice=None).values("notice"))
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    return {
        "onOldVersion": {TaskState(s).short: n for s, n in sorted(on_old.items())},
        "onOldVersionTotal": sum(on_old.values()),
        "moved": by_state.get(MoveState.MOVED, 0),
        "finishedOnOld": by_state.get(MoveState.FINISHED_ON_OLD, 0),
        "finishingOnOld": by_state.get(MoveState.FINISHING_ON_OLD, 0),
        "noticePending": by_state.get(MoveState.NOTICE_PENDING, 0),
        "orphaned": by_state.get(MoveState.ORPHANED, 0),
        "rebound": by_state.get(MoveState.REBOUND, 0),
        "reverted": by_state.get(MoveState.REVERTED, 0),
        "notices": {
            "delivered": notices.get(DeliveryState.DELIVERED, 0),
            "pending": notices.get(DeliveryState.PENDING, 0)
            + notices.get(DeliveryState.SENDING, 0),
            "dead": notices.get(DeliveryState.DEAD, 0),
            "superseded": notices.get(DeliveryState.SUPERSEDED, 0)
            + notices.get(DeliveryState.CANCELED, 0),
        },
    }


def rebind_stragglers(rebind: Rebind, limit: int = 100) -> list[dict[str, Any]]:
    """The tasks still on the old version (oldest move first): task, state, config, the old
    version, and where its notice stands."""
    rows = (
        ChannelMove.objects.filter(
            rebind=rebind, state__in=ON_OLD_MOVE_STATES, config__deleted_at__isnull=True
        )
        .exclude(task__state__in=[s.value for s in TERMINAL_STATES])
        .select_related("task", "config", "old_binding", "notice")
        .order_by("id")[:limit]
    )
    return [
        {
            "task": str(m.task_id),
            "state": m.task.task_state.short,
            "config": m.config.config_id,
            "version": f"{m.config.config_id}.v{m.old_binding.version}",
            "move": m.state,
            "notice": m.notice.state if m.notice else None,
            "noticeError": m.notice.last_error if m.notice else "",
            "since": m.created_at,
        }
        for m in rows
    ]


def push_channel_extension(agent: Agent, *, jwks_url: str) -> dict[str, Any]:
    """The card's declaration of how this agent rebinds push channels (AgentExtension,
    data only, not required): the policy, overlap, deadline and its action, the key ids of
    the current channel and of any draining one, the JWKS, the delivery guarantee."""
    keys = live_and_published_keys(agent)
    draining = [
        _present(
            {
                "rebindId": str(r.pk),
                "policy": r.policy,
                "state": r.state,
                "deadline": r.deadline.isoformat() if r.deadline else None,
                "oldKeyIds": [r.old_key.kid] if r.old_key_id else [],
                "movePrefix": r.move_from,
            }
        )
        for r in Rebind.objects.filter(agent=agent, state__in=OPEN_REBIND_STATES)
        .exclude(actor__startswith="client")
        .select_related("old_key")
        .order_by("created_at")
    ]
    return {
        "uri": PUSH_CHANNEL_URI,
        "description": "How this agent moves push channels (signing key, URLs) while tasks "
        "are in flight: a channel notice on the old channel first (docs/webhooks-receiving.md)",
        "required": False,
        # Empty values are left out: signed cards carry none (docs/decisions.md).
        "params": _present(
            {
                "policy": agent.push_rebind_policy,
                "minOverlapSeconds": max(agent.push_rebind_min_overlap, agent.card_max_age),
                "drainDeadlineSeconds": agent.push_rebind_deadline,
                "onTimeout": agent.push_rebind_on_timeout,
                "currentKeyIds": [k.kid for k in keys if k.state == SigningKeyState.ACTIVE],
                "nextKeyIds": [k.kid for k in keys if k.state == SigningKeyState.PUBLISHED],
                "drainingKeyIds": [k.kid for k in keys if k.state == SigningKeyState.RETIRING],
                "draining": draining,
                "jwksUrl": jwks_url,
                "deliveryGuarantee": "durable, at-least-once, in order per push config",
            }
        ),
    }


def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v not in (None, "", [], {})}


def live_and_published_keys(agent: Agent) -> list[SigningKey]:
    return list(
        SigningKey.objects.filter(
            agent=agent,
            state__in=[SigningKeyState.PUBLISHED, SigningKeyState.ACTIVE, SigningKeyState.RETIRING],
        ).order_by("-created_at", "-id")
    )
