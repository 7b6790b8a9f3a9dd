"""Reads of the rebind's console page (issue 16): its state, progress and deadline, the live
list of tasks still on the old version, and what each operator decision would do, in words,
before it is confirmed. No writes here: the page's actions call webhooks/rebinds/operations.py.

"Still on the old version" is `ChannelMove.objects.on_old()` (webhooks/models.py), what the
dashboard and `selectors.rebind_counts` count. Progress counts moves (one per config, so one
per task unless a task has several configs), as the dashboard's bar does.

One payload (`rebind_console`) is the page's only source: its title, state, facts, counts,
progress, deadline and both lists are rendered from it and re-rendered from it together when
it is polled, read in one snapshot so that they never disagree.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.utils import timezone

from a2a_platform.lib.times import when_text
from agents.models import PushChannelPolicy
from webhooks.errors import RebindInvalid
from webhooks.models import (
    ChannelMove,
    ChannelMoveQuerySet,
    Delivery,
    DeliveryAttempt,
    DeliveryKind,
    DeliveryState,
    MoveState,
    Rebind,
    RebindState,
)
from webhooks.rebinds import machine as rebind_machine
from webhooks.rebinds.checks import checked_abort_reason
from webhooks.selectors import rebind_counts

# The page's actions: name -> the rebind_machine operation it is.
ACTIONS: dict[str, str] = {
    "move_now": "move_now",
    "finish_on_old": "finish_on_old",
    "cut_over": "cut_over",
    "extend": "extend",
    "abort": "abort",
    "replay_notice": "replay_notice",
}
ACTIONS_ON_SELECTED = ("move_now", "finish_on_old")
MAX_ROWS = 500  # the live list's length; the page says how many more there are
MAX_REASON = 300
EXCERPT = 200  # of the receiver's answer to a notice, as the page shows it


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
    return ChannelMove.objects.filter(rebind=rebind).on_old().order_by("id")


def stuck_moves(rebind: Rebind) -> QuerySet[ChannelMove]:
    """The moves still on the old version because their notice dead-lettered: what "Replay
    notice" re-opens (a dead notice whose move was decided otherwise is left dead)."""
    return ChannelMove.objects.filter(rebind=rebind).notice_dead().order_by("id")


def _last_attempt(delivery: str) -> dict[str, Subquery]:
    """The receiver's last answer to a delivery (`delivery`: the path to its pk), as three
    annotations: what the deliveries admin's attempt timeline shows first."""
    last = DeliveryAttempt.objects.filter(delivery=OuterRef(delivery)).order_by("-number")
    return {
        "answer_status": Subquery(last.values("status")[:1]),
        "answer_excerpt": Subquery(last.values("response_excerpt")[:1]),
        "answer_detail": Subquery(last.values("error_detail")[:1]),
    }


def _answer(obj: Any) -> dict[str, Any] | None:
    """The annotated last answer: HTTP status (None without one), a body excerpt, the
    failure in words; None when never tried."""
    status, excerpt, detail = obj.answer_status, obj.answer_excerpt, obj.answer_detail
    if status is None and not excerpt and not detail:
        return None
    excerpt = (excerpt or "").strip()
    if len(excerpt) > EXCERPT:
        excerpt = excerpt[: EXCERPT - 1] + "…"
    return {"status": status, "excerpt": excerpt, "detail": detail or ""}


def answer_text(answer: dict[str, Any] | None) -> str:
    """ "HTTP 400: {"error": …}" (the task page and the confirmation say it so)."""
    if not answer:
        return ""
    head = f"HTTP {answer['status']}" if answer["status"] is not None else answer["detail"]
    return f"{head}: {answer['excerpt']}" if answer["excerpt"] else head


def notice_answers(event_ids: Iterable[str]) -> dict[str, dict[str, Any] | None]:
    """Each notice's last answer by its event id (the task page's channel history): one
    query."""
    rows = Delivery.objects.filter(event_id__in=list(event_ids)).annotate(**_last_attempt("pk"))
    return {str(d.event_id): _answer(d) for d in rows.only("event_id")}


def _notice(m: ChannelMove) -> dict[str, Any] | None:
    n = m.notice
    if n is None:
        return None
    return {
        "id": str(n.event_id),
        "state": n.state,
        "stateLabel": n.get_state_display(),
        "dead": n.state == DeliveryState.DEAD,
        "attempts": n.attempts,
        "lastError": n.last_error,
        "answer": _answer(m),
    }


def _move_label(m: ChannelMove, notice: dict[str, Any] | None) -> str:
    if m.state == MoveState.NOTICE_PENDING and notice and notice["dead"]:
        return "stuck on the old channel: its notice was dead-lettered"
    return m.get_state_display()


def _moves(rebind: Rebind, limit: int) -> list[dict[str, Any]]:
    """Every move of the rebind (the page's moves list, oldest first): one query."""
    moves = (
        ChannelMove.objects.filter(rebind=rebind)
        .select_related("config", "old_binding", "new_binding", "notice")
        .annotate(**_last_attempt("notice"))
        .order_by("id")[:limit]
    )
    rows = []
    for m in moves:
        notice = _notice(m)
        rows.append(
            {
                "move": m.pk,
                "task": str(m.task_id),
                "config": m.config.config_id,
                "versions": f"v{m.old_binding.version} → "
                + (f"v{m.new_binding.version}" if m.new_binding else "-"),
                "state": m.state,
                "stateLabel": _move_label(m, notice),
                "notice": notice,
                "finishedAt": _iso(m.finished_at),
            }
        )
    return rows


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _progress(rebind: Rebind, counts: dict[str, Any]) -> dict[str, Any]:
    """Planned moves, those still on the old version, and how the rebind ended, from its
    counts (`selectors.rebind_counts`: the API's and the shell's too) plus one aggregate.
    `tone` says how the bar reads: only a completed rebind is a success; an aborted or
    cut-over one shows what it moved, never a full bar."""
    totals = ChannelMove.objects.filter(rebind=rebind).aggregate(
        start=Count("id"),
        stuck=Count(
            "id",
            filter=ChannelMoveQuerySet.notice_dead_q(),
        ),
    )
    start, left = totals["start"], counts["onOldVersionTotal"]
    moved, orphaned = counts["moved"], counts["orphaned"]
    stayed = start - moved - counts["rebound"]
    if rebind.state == RebindState.COMPLETED:
        tone, percent = "done", 100
        text = f"completed: {_tasks(moved)} moved" + (
            f", {counts['finishedOnOld']} finished on the old channel"
            if counts["finishedOnOld"]
            else ""
        )
    elif rebind.state == RebindState.CUT_OVER:
        tone, percent = "cut_over", moved * 100 // start if start else 0
        text = f"cut over: {_tasks(moved)} moved, {orphaned} orphaned (waiting to be re-bound)" + (
            f", {counts['rebound']} re-bound" if counts["rebound"] else ""
        )
    elif rebind.state == RebindState.ABORTED:
        tone, percent = "aborted", moved * 100 // start if start else 0
        text = f"aborted: {_tasks(moved)} moved, {stayed} returned to the old channel"
    else:
        tone = "open"
        # The bar fills as tasks leave the old version.
        percent = (start - left) * 100 // start if start else 0
        more = "" if rebind.moves_planned else "+"
        text = f"{left} of {start}{more} left on the old version"
    return {
        "start": start,
        "left": left,
        "moved": moved,
        "orphaned": orphaned,
        "stuck": totals["stuck"],
        "planningDone": rebind.moves_planned,
        "percent": percent,
        "tone": tone,
        "text": text,
    }


def _rows(rebind: Rebind, now: datetime, limit: int) -> list[dict[str, Any]]:
    """The live list: three queries whatever its length (the moves with their task, config,
    old binding and notice; the newest delivery on each old binding other than the notice)."""
    newest = (
        Delivery.objects.filter(binding=OuterRef("old_binding"))
        .exclude(kind=DeliveryKind.NOTICE)
        .order_by("-id")
        .values("id")[:1]
    )
    moves = list(
        on_old_moves(rebind)
        .select_related("task", "config", "old_binding", "notice")
        .annotate(last_delivery_pk=Subquery(newest), **_last_attempt("notice"))[:limit]
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
        notice = _notice(m)
        rows.append(
            {
                "move": m.pk,
                "task": str(m.task_id),
                "taskState": m.task.task_state.short,
                "config": m.config.config_id,
                "oldVersion": f"{m.config.config_id}.v{m.old_binding.version}",
                "moveState": m.state,
                "moveStateLabel": _move_label(m, notice),
                "stuck": bool(notice and notice["dead"] and m.state == MoveState.NOTICE_PENDING),
                "notice": notice,
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


def in_flight_text(rebind: Rebind) -> str:
    """What happens to the tasks in flight when the rebind starts, in words (the field
    `finish_on_old` as a ✗ read as its opposite)."""
    if rebind.policy == PushChannelPolicy.CUTOVER:
        return "orphaned at once, each told on its old channel (cutover)"
    if rebind.finish_on_old:
        return "stay on the old channel until they end (finish on old)"
    return "move once their notice on the old channel is delivered (drain)"


def state_label(state: str) -> str:
    """A rebind state as people say it: "cut over", not "cut_over"."""
    return RebindState(state).label if state in RebindState.values else state.replace("_", " ")


def rebind_console(rebind: Rebind, *, limit: int = MAX_ROWS) -> dict[str, Any]:
    """What the rebind's page shows and its JSON view answers (polled every few seconds),
    all from one snapshot: title, state, facts, counts, progress, deadline (`deadlineRunning`:
    only an open rebind's deadline counts down), which actions are legal now, the tasks still
    on the old version and every move. A fixed number of queries, whatever the lists' length."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        # The row as this snapshot has it (the caller's copy may be older than the lists).
        rebind = Rebind.objects.select_related("agent", "config").get(pk=rebind.pk)
        now = timezone.now()
        counts = rebind_counts(rebind)
        progress = _progress(rebind, counts)
        label = state_label(rebind.state)
        return {
            "id": str(rebind.pk),
            "title": f"Rebind of {rebind.agent.slug}: {label}",
            "agent": rebind.agent.slug,
            "state": rebind.state,
            "stateLabel": label,
            "open": rebind.is_open,
            "policy": rebind.policy,
            "finishOnOld": rebind.finish_on_old,
            "inFlight": in_flight_text(rebind),
            "onTimeout": rebind.on_timeout,
            "scope": scope_text(rebind),
            "reason": rebind.reason,
            "counts": counts,
            "progress": progress,
            "deadline": _iso(rebind.deadline),
            "deadlineRunning": bool(rebind.is_open and rebind.deadline),
            "extendedAt": _iso(rebind.extended_at),
            "startedAt": _iso(rebind.started_at),
            "finishedAt": _iso(rebind.finished_at),
            "actions": legal_actions(rebind.state),
            "onOld": _rows(rebind, now, limit),
            "onOldTotal": progress["left"],
            "moves": _moves(rebind, limit),
            "movesTotal": progress["start"],
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
    only: int | None = None  # replay_notice: the one move whose notice is replayed
    notices: list[uuid.UUID] = field(default_factory=list)  # replay_notice: their event ids


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


def _replay_plan(rebind: Rebind, data: Mapping[str, Any]) -> ActionPlan:
    """Replay the dead notice of one move (`only`, a row's button) or of every move stuck on
    it: the deliveries admin's replay (webhooks/console/delivery_actions.py), same event ids."""
    stuck = stuck_moves(rebind)
    only = str(data.get("only", "")).strip()
    if only:
        [pk] = _selected_pks([only])
        stuck = stuck.filter(pk=pk)
    # Confirmed: exactly the moves the confirmation listed (those still stuck).
    listed = data.getlist("listed") if hasattr(data, "getlist") else data.get("listed", [])
    if listed:
        stuck = stuck.filter(pk__in=_selected_pks(listed))
    moves = list(
        stuck.select_related("task", "config", "notice").annotate(**_last_attempt("notice"))
    )
    if not moves:
        raise ActionInputInvalid(
            "no notice of this rebind is dead-lettered now (replayed, delivered, or its task "
            "left the old version)"
        )
    for m in moves:
        m.answer_text = answer_text(_answer(m))
    return ActionPlan(
        action="replay_notice",
        summary=(
            f"replay {len(moves)} dead-lettered notice{'' if len(moves) == 1 else 's'}: each "
            "is sent again on its old channel (same event id, a fresh retry schedule); once "
            "delivered, its task moves to the new channel"
        ),
        details=[
            "the receiver answered each one as listed; fix the receiver first, or the replay "
            "dead-letters again",
        ],
        moves=moves[:MAX_ROWS],
        move_pks=[m.pk for m in moves],
        only=int(only) if only else None,
        notices=[m.notice.event_id for m in moves],
    )


def _cut_over_effect(rebind: Rebind) -> str:
    """What a cutover switches for the tasks not orphaned, as the rebind asked: its new
    channel (a moved URL or one config's new URL or credentials), its new key, or both."""
    moves_channel = bool(rebind.move_from or rebind.config_id)
    if moves_channel and rebind.rotate_key:
        return "the new channel, signed with the new key, takes every other delivery from now on"
    if rebind.rotate_key:
        return "the new key signs every other delivery from now on (the URLs stay)"
    return "the new channel takes every other delivery from now on (the signing key stays)"


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
    if action == "replay_notice":
        return _replay_plan(rebind, data)
    left = on_old_moves(rebind).count()
    if action == "cut_over":
        return ActionPlan(
            action=action,
            summary=f"cut over: {_tasks(left)} still on old will be orphaned",
            details=[
                "each orphaned task gets a final notice on its old channel; its new channel "
                "waits until an operator re-binds it",
                _cut_over_effect(rebind),
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
        was = when_text(rebind.deadline, now=now) if rebind.deadline else "none"
        return ActionPlan(
            action=action,
            summary=(
                f"extend the deadline by {minutes} minute{'' if minutes == 1 else 's'}: "
                f"from {was} to {when_text(new, now=now)}"
            ),
            details=[f"{_tasks(left)} still on old keep draining; the deadline alerts start over"],
            seconds=minutes * 60,
            minutes=minutes,
        )
    if action == "abort":
        try:  # the service's rule, asked before the confirmation
            reason = checked_abort_reason(str(data.get("reason", "")))
        except RebindInvalid as exc:
            raise ActionInputInvalid(exc.description) from None
        if len(reason) > MAX_REASON:
            raise ActionInputInvalid(f"the reason must be at most {MAX_REASON} characters")
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
