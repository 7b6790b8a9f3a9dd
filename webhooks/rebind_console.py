"""Reads of the rebind's console page (issue 16): its state, progress and deadline, the live
list of tasks still on the old version, and what each operator decision would do, in words,
before it is confirmed. No writes here: the page's actions call webhooks/rebind.py.

"Still on the old version" is what the dashboard and `selectors.rebind_counts` count: a move
waiting for its notice or finishing on the old channel, of a live config, whose task is not
terminal. Progress counts moves (one per config, so one per task unless a task has several
configs), as the dashboard's bar does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from tasks.states import TERMINAL_STATES
from webhooks import rebind_machine
from webhooks.models import (
    ON_OLD_MOVE_STATES,
    ChannelMove,
    Delivery,
    MoveState,
    Rebind,
)

# The page's actions: name -> the rebind_machine operation it is.
ACTIONS: dict[str, str] = {
    "move_now": "move_now",
    "finish_on_old": "finish_on_old",
    "cut_over": "cut_over",
    "extend": "extend",
    "abort": "abort",
}
ACTIONS_ON_SELECTED = ("move_now", "finish_on_old")
MAX_ROWS = 500  # the live list's length; the page says how many more there are
MAX_REASON = 300


def scope_text(rebind: Rebind) -> str:
    parts = ["rotate key"] if rebind.rotate_key else []
    if rebind.move_from:
        parts.append(f"{rebind.move_from} → {rebind.move_to}")
    if rebind.config_id:
        parts.append(f"one config ({rebind.config.config_id})")
    return ", ".join(parts) or "-"


def legal_actions(state: str) -> dict[str, bool]:
    """Which of the page's actions the rebind's state allows (rebind_machine.py)."""
    return {name: rebind_machine.can(op, state) for name, op in ACTIONS.items()}


def on_old_moves(rebind: Rebind) -> QuerySet[ChannelMove]:
    """The rebind's moves still on the old version, oldest first."""
    return (
        ChannelMove.objects.filter(
            rebind=rebind, state__in=ON_OLD_MOVE_STATES, config__deleted_at__isnull=True
        )
        .exclude(task__state__in=[s.value for s in TERMINAL_STATES])
        .order_by("id")
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _progress(rebind: Rebind) -> dict[str, Any]:
    """Planned moves and those still on the old version (two aggregates, one query)."""
    live_on_old = Q(state__in=ON_OLD_MOVE_STATES, config__deleted_at__isnull=True) & ~Q(
        task__state__in=[s.value for s in TERMINAL_STATES]
    )
    totals = ChannelMove.objects.filter(rebind=rebind).aggregate(
        start=Count("id"),
        left=Count("id", filter=live_on_old),
        moved=Count("id", filter=Q(state=MoveState.MOVED)),
        orphaned=Count("id", filter=Q(state=MoveState.ORPHANED)),
    )
    start, left = totals["start"], totals["left"]
    return {
        "start": start,
        "left": left,
        "moved": totals["moved"],
        "orphaned": totals["orphaned"],
        "planningDone": rebind.moves_planned,
        # The bar fills as tasks leave the old version.
        "percent": (start - left) * 100 // start if start else 0,
    }


def _rows(rebind: Rebind, now: datetime, limit: int) -> list[dict[str, Any]]:
    """The live list: three queries whatever its length (the moves with their task, config,
    old binding and notice; the newest delivery on each old binding other than the notice)."""
    newest = (
        Delivery.objects.filter(binding=OuterRef("old_binding"))
        .exclude(kind="notice")
        .order_by("-id")
        .values("id")[:1]
    )
    moves = list(
        on_old_moves(rebind)
        .select_related("task", "config", "old_binding", "notice")
        .annotate(last_delivery_pk=Subquery(newest))[:limit]
    )
    last = {
        d.pk: d
        for d in Delivery.objects.filter(
            pk__in=[m.last_delivery_pk for m in moves if m.last_delivery_pk]
        ).only("id", "kind", "state", "created_at", "finished_at", "last_status", "last_error")
    }
    rows = []
    for m in moves:
        d = last.get(m.last_delivery_pk)
        rows.append(
            {
                "move": m.pk,
                "task": str(m.task_id),
                "taskState": m.task.task_state.short,
                "config": m.config.config_id,
                "oldVersion": f"{m.config.config_id}.v{m.old_binding.version}",
                "moveState": m.state,
                "moveStateLabel": m.get_state_display(),
                "notice": (
                    {"state": m.notice.state, "lastError": m.notice.last_error}
                    if m.notice
                    else None
                ),
                "lastDelivery": (
                    {
                        "kind": d.kind,
                        "state": d.state,
                        "at": _iso(d.finished_at or d.created_at),
                        "status": d.last_status,
                        "error": d.last_error,
                    }
                    if d
                    else None
                ),
                "since": _iso(m.created_at),
                "sinceSeconds": round((now - m.created_at).total_seconds(), 1),
            }
        )
    return rows


def rebind_console(rebind: Rebind, *, limit: int = MAX_ROWS) -> dict[str, Any]:
    """What the rebind's page shows and its JSON view answers (polled every few seconds):
    state, policy, scope, progress, deadline, which actions are legal now, and the tasks
    still on the old version. Five queries (the rebind, progress, the list, its deliveries)."""
    now = timezone.now()
    progress = _progress(rebind)
    return {
        "id": str(rebind.pk),
        "agent": rebind.agent.slug,
        "state": rebind.state,
        "stateLabel": rebind.get_state_display(),
        "open": rebind.is_open,
        "policy": rebind.policy,
        "finishOnOld": rebind.finish_on_old,
        "onTimeout": rebind.on_timeout,
        "scope": scope_text(rebind),
        "progress": progress,
        "deadline": _iso(rebind.deadline),
        "extendedAt": _iso(rebind.extended_at),
        "actions": legal_actions(rebind.state),
        "onOld": _rows(rebind, now, limit),
        "onOldTotal": progress["left"],
        "generatedAt": now.isoformat(),
    }


class ActionInputInvalid(ValueError):
    """What the operator typed or selected cannot be acted on (said in words)."""


@dataclass(frozen=True)
class ActionPlan:
    """One decision as the confirmation page states it, and what the service is called with."""

    action: str
    summary: str
    details: list[str] = field(default_factory=list)
    moves: list[ChannelMove] = field(default_factory=list)  # the selected ones, listed
    move_pks: list[int] = field(default_factory=list)
    seconds: int | None = None
    minutes: int | None = None
    reason: str = ""


def _selected_pks(values: Iterable[str]) -> list[int]:
    try:
        pks = sorted({int(v) for v in values})
    except ValueError:
        raise ActionInputInvalid("the selection is malformed: reload the page") from None
    if not pks:
        raise ActionInputInvalid("select at least one task still on the old version")
    return pks


def _tasks(n: int) -> str:
    return f"{n} task{'' if n == 1 else 's'}"


def action_plan(rebind: Rebind, action: str, data: Mapping[str, Any]) -> ActionPlan:
    """What `action` would do to this rebind now, given the page's input (`data`: the
    selected `move` pks, `minutes`, `reason`). Raises ActionInputInvalid."""
    if action in ACTIONS_ON_SELECTED:
        pks = _selected_pks(data.getlist("move") if hasattr(data, "getlist") else data["move"])
        moves = list(
            on_old_moves(rebind).filter(pk__in=pks).select_related("task", "config", "notice")
        )
        if not moves:
            raise ActionInputInvalid(
                "none of the selected tasks is still on the old version (they moved or finished)"
            )
        gone = len(pks) - len(moves)
        details = []
        if gone:
            details.append(f"{gone} selected task(s) already left the old version: left alone")
        if action == "move_now":
            summary = (
                f"move {_tasks(len(moves))} now: each one's new channel takes its deliveries "
                "at once, without waiting for the notice (a notice still open is withdrawn); "
                "a task finishing on the old channel gets its move and notice now"
            )
        else:
            waiting = [m for m in moves if m.state == MoveState.NOTICE_PENDING]
            already = len(moves) - len(waiting)
            if not waiting:
                raise ActionInputInvalid(
                    "every selected task is already finishing on the old channel"
                )
            summary = (
                f"let {_tasks(len(waiting))} finish on the old channel: each one's notice is "
                "withdrawn and its deliveries stay on the old version until the task ends"
            )
            if already:
                details.append(f"{already} selected already finishing on old: unchanged")
            moves = waiting
        return ActionPlan(
            action=action,
            summary=summary,
            details=details,
            moves=moves,
            move_pks=[m.pk for m in moves],
        )
    left = on_old_moves(rebind).count()
    if action == "cut_over":
        return ActionPlan(
            action=action,
            summary=f"cut over: {_tasks(left)} still on old will be orphaned",
            details=[
                "each orphaned task gets a final notice on its old channel; its new channel "
                "waits until an operator re-binds it",
                "the new channel (and a new key) takes every other delivery from now on",
            ],
        )
    if action == "extend":
        raw = str(data.get("minutes", "")).strip()
        most = settings.A2A_REBIND_MAX_DEADLINE_SECONDS // 60
        if not raw.isdigit() or not 1 <= int(raw) <= most:
            raise ActionInputInvalid(
                f"extend by a whole number of minutes from 1 to {most} (not {raw!r})"
            )
        minutes = int(raw)
        now = timezone.now()
        base = max(rebind.deadline, now) if rebind.deadline else now
        new = base + timedelta(minutes=minutes)
        was = rebind.deadline.isoformat(timespec="seconds") if rebind.deadline else "none"
        return ActionPlan(
            action=action,
            summary=(
                f"extend the deadline by {minutes} minute{'' if minutes == 1 else 's'}: "
                f"from {was} to {new.isoformat(timespec='seconds')}"
            ),
            details=[f"{_tasks(left)} still on old keep draining; the deadline alerts start over"],
            seconds=minutes * 60,
            minutes=minutes,
        )
    if action == "abort":
        reason = str(data.get("reason", "")).strip()
        if not reason:
            raise ActionInputInvalid("say why the rebind is aborted (a reason is recorded)")
        if len(reason) > MAX_REASON:
            raise ActionInputInvalid(f"the reason must be at most {MAX_REASON} characters")
        if "\x00" in reason:  # PostgreSQL refuses NUL in text
            raise ActionInputInvalid("the reason cannot contain a NUL character")
        moved = ChannelMove.objects.filter(rebind=rebind, state=MoveState.MOVED).count()
        return ActionPlan(
            action=action,
            summary=f"abort: {_tasks(left)} still on old stay on their old channel",
            details=[
                f"{_tasks(moved)} already moved stay moved",
                "notices still open are withdrawn; what was held for a new channel goes to "
                "the old one",
                f"reason recorded: {reason}",
            ],
            reason=reason,
        )
    raise ActionInputInvalid(f"no such action {action!r}")
