"""Liveness (`/healthz`) and readiness (`/readyz`) views: the gate's checks
(agents/readiness.py, which caches them per process) plus the broker's and the open alerts."""

from __future__ import annotations

import logging

from django.http import HttpRequest, JsonResponse

from agents import readiness as gate
from webhooks.models import Alert

logger = logging.getLogger(__name__)


def open_alerts(limit: int = 10) -> list[dict]:
    """The open alerts; when they cannot be read (the database check says why), one entry
    saying so: an empty list would read as "nothing is wrong"."""
    try:
        rows = Alert.objects.filter(resolved_at__isnull=True).select_related("endpoint")
        return [
            {"kind": a.kind, "message": a.message, "count": a.count, "endpoint": str(a.endpoint)}
            for a in rows[:limit]
        ]
    except Exception as exc:  # readyz must answer whatever broke
        logger.warning("open alerts could not be read", exc_info=True)
        return [{"kind": "unreadable", "message": f"alerts could not be read: {exc!r}"[:300]}]


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """The same gate as the agent card plus the broker check (agents/readiness.py
    instance_readiness, which the dashboard and the web heartbeat share)."""
    state = gate.instance_readiness()
    ready = state.ready
    body = state.as_json()
    # Open delivery alerts are for operators; they do not make the instance unready.
    body["alerts"] = open_alerts()
    response = JsonResponse(body, status=200 if ready else 503)
    if not ready:
        response["Retry-After"] = str(gate.RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response
