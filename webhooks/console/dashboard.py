"""The operators' dashboard (the admin's landing page and its JSON poll): reads only.

`dashboard_data` returns the whole dashboard as plain, JSON-serialisable data in a bounded
number of queries whatever the size of the store: figures are aggregated per agent and state
in the database (one query per section), never counted row by row in Python.

Which sections a viewer gets is the caller's decision (`sections_for` maps a user's model
permissions to sections; webhooks/console/views.py asks it): a section left out is absent from
the data, not zeroed, so the page says "not shown" rather than "nothing is wrong".
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone

from agents import readiness as gate
from agents.models import Agent, OperatorAction, WebInstance
from webhooks.models import Alert, DeliveryAttempt, Endpoint, RebindState
from webhooks.selectors import (
    ENDPOINT_TROUBLES,
    delivery_backlog,
    endpoint_health,
    open_rebinds_progress,
)

MINUTES = 60  # the per-minute chart's window
NEWEST_ALERTS = 5
RECENT_ACTIONS = 10
ENDPOINT_ROWS = 20

# Section -> the model permission (app_label.view_<model>) that shows it. Readiness and the
# per-agent capabilities need no model permission: /readyz and the cards already publish them.
SECTION_PERMISSIONS = {
    "deliveries": "webhooks.view_delivery",
    "endpoints": "webhooks.view_endpoint",
    "alerts": "webhooks.view_alert",
    "rebinds": "webhooks.view_rebind",
}
SECTIONS = frozenset(SECTION_PERMISSIONS)


def sections_for(user) -> frozenset[str]:
    """The sections a staff user may see: each needs the view (or change) permission of its
    model, so a user without any permission on deliveries sees no delivery figure (queue
    depth, oldest pending, dead letters, the per-minute chart), only readiness."""
    shown = set()
    for section, perm in SECTION_PERMISSIONS.items():
        app_label, codename = perm.split(".")
        change = f"{app_label}.{codename.replace('view_', 'change_', 1)}"
        if user.has_perm(perm) or user.has_perm(change):
            shown.add(section)
    return frozenset(shown)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _age(now: datetime, value: datetime | None) -> float | None:
    return round((now - value).total_seconds(), 1) if value else None


def _web_instances(now: datetime, state: gate.Readiness) -> list[dict[str, Any]]:
    """Every web process's last heartbeat (agents.WebInstance): its readiness when it last
    wrote, and whether it still writes (live: within three heartbeat intervals). The row of
    the instance answering shows its readiness now, the state the block above it shows (its
    stored row may be a beat behind: a worker that registered since would read "no worker
    consumes `agents`" beside "ready")."""
    stale_after = 3 * settings.A2A_WEB_HEARTBEAT_SECONDS
    me = gate.instance_name()
    rows = []
    for w in WebInstance.objects.order_by("name"):
        row = {
            "name": w.name,
            "thisInstance": w.name == me,
            "beatAgeSeconds": _age(now, w.beat_at),
            "live": (now - w.beat_at).total_seconds() <= stale_after,
            "ready": w.ready,
            "draining": w.draining,
            "failing": w.failing,
            "startedAt": _iso(w.started_at),
        }
        if row["thisInstance"]:
            row.update(live=True, ready=state.ready, draining=state.draining)
            row["failing"] = state.failing()
        rows.append(row)
    return rows


def _readiness(now: datetime) -> tuple[dict[str, Any], gate.Readiness]:
    """This instance's readiness (what /readyz answers: agents/readiness.py
    instance_readiness, broker included), every web instance's last readiness and every
    worker's heartbeat with its age: the workers are the other instances the gate depends
    on."""
    state = gate.instance_readiness()
    checks = gate.instance_checks(state)
    fresh = settings.A2A_HEARTBEAT_FRESH_SECONDS
    workers = [
        {
            "id": w.pk,
            "hostname": w.hostname,
            "queues": list(w.queues),
            "beatAgeSeconds": _age(now, w.beat_at),
            "live": live,
            "startedAt": _iso(w.started_at),
            "backlogReenqueued": w.backlog_reenqueued_at is not None
            and w.backlog_reenqueued_at >= w.started_at,
            "hosted": w.hosted,
        }
        for w, live in gate.worker_liveness(now)
    ]
    return {
        "instance": gate.instance_name(),
        "ready": state.ready,
        "draining": state.draining,
        "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in checks],
        "workers": workers,
        "webInstances": _web_instances(now, state),
        "heartbeatFreshSeconds": fresh,
    }, gate.current()  # the cards' gate: a broker outage does not withdraw a served card


def _delivery_figures(agent_pks: list[int], now: datetime) -> dict[int, dict[str, Any]]:
    """Per agent: queue depth (pending + sending), held, dead letters, the oldest open
    delivery's age, and delivered/failed attempts per minute over the last hour."""
    figures: dict[int, dict[str, Any]] = {
        pk: {
            "queueDepth": 0,
            "pending": 0,
            "sending": 0,
            "held": 0,
            "dead": 0,
            "oldestPendingAgeSeconds": None,
            "oldestPendingAt": None,
            "perMinute": {"delivered": [0] * MINUTES, "failed": [0] * MINUTES},
            "lastHour": {"delivered": 0, "failed": 0},
        }
        for pk in agent_pks
    }
    for agent, backlog in delivery_backlog().items():
        f = figures.get(agent)
        if f is None:
            continue
        f.update(
            queueDepth=backlog.queue_depth,
            pending=backlog.pending,
            sending=backlog.sending,
            held=backlog.held,
            dead=backlog.dead,
            oldestPendingAt=_iso(backlog.oldest_open_at),
            oldestPendingAgeSeconds=_age(now, backlog.oldest_open_at),
        )

    # Finished attempts only (an attempt row is written at claim time, its outcome when the
    # send returns: duration_ms is set then). Delivered: a 2xx answer; anything else failed.
    start = _window_start(now)
    attempts = (
        DeliveryAttempt.objects.filter(started_at__gte=start, duration_ms__isnull=False)
        .annotate(minute=TruncMinute("started_at"))
        .values("delivery__task__agent_id", "minute")
        .annotate(
            total=Count("id"),
            delivered=Count("id", filter=Q(status__gte=200, status__lt=300)),
        )
        .order_by()
    )
    for row in attempts:
        f = figures.get(row["delivery__task__agent_id"])
        index = int((row["minute"] - start).total_seconds() // 60)
        if f is None or not 0 <= index < MINUTES:
            continue
        f["perMinute"]["delivered"][index] += row["delivered"]
        f["perMinute"]["failed"][index] += row["total"] - row["delivered"]
        f["lastHour"]["delivered"] += row["delivered"]
        f["lastHour"]["failed"] += row["total"] - row["delivered"]
    return figures


def _window_start(now: datetime) -> datetime:
    """The first minute of the chart: the current minute is its last bucket."""
    return now.replace(second=0, microsecond=0) - timedelta(minutes=MINUTES - 1)


def _endpoints() -> dict[str, Any]:
    """Every endpoint up to ENDPOINT_ROWS, the troubled first (failing by streak, then
    paused), each with its last hour's success rate and latency (selectors.endpoint_health,
    the endpoints page's figures): a healthy endpoint is listed with its rate, so "nothing
    failing" reads as a list of working receivers rather than "none"."""
    counts = Endpoint.objects.aggregate(
        total=Count("id"),
        failing=Count("id", filter=ENDPOINT_TROUBLES["breaker"]),
        paused=Count("id", filter=ENDPOINT_TROUBLES["paused"]),
    )
    rows = list(
        Endpoint.objects.order_by(
            "-consecutive_failures", F("paused_at").desc(nulls_last=True), "origin"
        )[:ENDPOINT_ROWS]
    )
    health = endpoint_health(rows)
    return {
        "total": counts["total"],
        "failing": counts["failing"],
        "paused": counts["paused"],
        "rows": [
            {
                "id": e.pk,
                "origin": e.origin,
                "state": "paused" if e.paused_at else "failing" if e.consecutive_failures else "ok",
                "consecutiveFailures": e.consecutive_failures,
                "pausedAt": _iso(e.paused_at),
                "pausedReason": e.paused_reason,
                "lastFailureAt": _iso(e.last_failure_at),
                "lastSuccessAt": _iso(e.last_success_at),
                "lastHour": health[e.pk]["lastHour"],
            }
            for e in rows
        ],
    }


def _alerts() -> dict[str, Any]:
    open_alerts = Alert.objects.filter(resolved_at__isnull=True)
    newest = open_alerts.select_related("endpoint").order_by("-last_seen_at", "-id")
    return {
        "open": open_alerts.count(),
        "newest": [
            {
                "id": a.pk,
                "kind": a.kind,
                "title": a.get_kind_display(),
                "message": a.message,
                "count": a.count,
                "endpoint": a.endpoint.origin if a.endpoint_id else None,
                "lastSeenAt": _iso(a.last_seen_at),
            }
            for a in newest[:NEWEST_ALERTS]
        ],
    }


def _rebinds(now: datetime) -> list[dict[str, Any]]:
    """Every open rebind with its progress (webhooks.selectors.open_rebinds_progress)."""
    out = []
    for p in open_rebinds_progress():
        r, planned, done = p.rebind, p.planned, p.done
        out.append(
            {
                "id": str(r.pk),
                "agent": r.agent.slug,
                "state": r.state,
                "stateLabel": r.get_state_display(),
                "policy": r.policy,
                "plannedMoves": planned,
                "planningDone": r.moves_planned,
                "done": done,
                "progress": round(done / planned, 4) if planned else 0.0,
                "percent": done * 100 // planned if planned else 0,
                "onOldVersion": p.on_old,
                "orphaned": p.orphaned,
                "deadline": _iso(r.deadline),
                "startsAt": _iso(r.scheduled_for) if r.state == RebindState.SCHEDULED else None,
                "deadlineInSeconds": _age(r.deadline, now) if r.deadline else None,
            }
        )
    return out


def _card(agent: Agent, state: gate.Readiness) -> str:
    """How this instance answers the agent's card now, in words."""
    if not agent.enabled:
        return "disabled"
    if not state.card_servable:
        return "503: draining" if state.draining else "503: never ready"
    why = state.agent_not_ready(agent)
    return "served" if why is None else f"503: {why}"


def dashboard_data(*, sections: frozenset[str] = SECTIONS) -> dict[str, Any]:
    """The whole dashboard as plain data. `sections`: which of SECTIONS to include
    (readiness and the agents' capabilities always are); see `sections_for`."""
    now = timezone.now()
    readiness, state = _readiness(now)
    agents = list(Agent.objects.order_by("slug"))
    delivery = _delivery_figures([a.pk for a in agents], now) if "deliveries" in sections else {}
    agent_rows = []
    for agent in agents:
        caps = gate.capabilities(agent, state)
        row: dict[str, Any] = {
            "id": agent.pk,
            "slug": agent.slug,
            "name": agent.name,
            "enabled": agent.enabled,
            "cardServable": agent.enabled
            and state.card_servable
            and state.agent_not_ready(agent) is None,
            "card": _card(agent, state),
            "capabilities": {
                name: {"on": cap.on, "reason": cap.reason} for name, cap in caps.items()
            },
        }
        if "deliveries" in sections:
            row["deliveries"] = delivery[agent.pk]
        agent_rows.append(row)
    data: dict[str, Any] = {
        "generatedAt": now.isoformat(),
        "sections": sorted(sections),
        "readiness": readiness,
        "agents": agent_rows,
    }
    if "deliveries" in sections:
        data["chart"] = {"start": _window_start(now).isoformat(), "minutes": MINUTES}
        data["totals"] = {
            key: sum(r["deliveries"][key] for r in agent_rows)
            for key in ("queueDepth", "held", "dead")
        }
    if "endpoints" in sections:
        data["endpoints"] = _endpoints()
    if "alerts" in sections:
        data["alerts"] = _alerts()
    if "rebinds" in sections:
        data["rebinds"] = _rebinds(now)
    return data


def target_text(target: dict) -> str:
    """An audit row's target in words: "endpoint 3", "2 deliveries"."""
    parts = []
    for key, value in (target or {}).items():
        if isinstance(value, list):
            parts.append(f"{len(value)} {key}" if len(value) != 1 else f"{key} {value[0]}")
        elif isinstance(value, dict):
            parts.append(key)
        else:
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def recent_actions(user) -> list[dict[str, Any]] | None:
    """The operators' newest actions (the platform's own audit trail, agents.OperatorAction,
    which every service writes; Django's LogEntry only knows the admin's stock add/change
    forms): None for a user who may not read the audit trail."""
    if not user.has_perm("agents.view_operatoraction"):
        return None
    return [
        {
            "id": a.pk,
            "actor": a.actor,
            "action": a.action.replace("_", " "),
            "target": target_text(a.target),
            "at": a.created_at,
        }
        for a in OperatorAction.objects.order_by("-created_at", "-id")[:RECENT_ACTIONS]
    ]
