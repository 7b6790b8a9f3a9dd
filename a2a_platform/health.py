"""Liveness (`/healthz`) and readiness (`/readyz`) with named checks.

Readiness is cached for at most a second per process: the card endpoint (readiness issue)
consults it on every request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse

logger = logging.getLogger(__name__)

CACHE_SECONDS = 1.0
RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


def check_database() -> Check:
    try:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return Check("database", False, f"unreachable: {exc.__class__.__name__}")
    return Check("database", True, connections[DEFAULT_DB_ALIAS].vendor)


def check_migrations() -> Check:
    try:
        executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:
        return Check("migrations", False, f"cannot inspect: {exc.__class__.__name__}")
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        return Check("migrations", False, f"{len(plan)} unapplied: {names}")
    return Check("migrations", True, "all applied")


def check_broker() -> Check:
    from a2a_platform.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            transport = conn.transport_cls
    except Exception as exc:
        return Check("broker", False, f"unreachable: {exc.__class__.__name__}")
    return Check("broker", True, str(transport))


def open_alerts(limit: int = 10) -> list[dict]:
    """The open alerts; when they cannot be read (the database check says why), one entry
    saying so: an empty list would read as "nothing is wrong"."""
    try:
        from webhooks.models import Alert

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
    """The same gate as the agent card (agents/readiness.py), plus the broker check."""
    from agents import readiness as gate

    state = gate.current()
    broker = check_broker()
    ready = state.ready and broker.ok
    body = state.as_json()
    body["status"] = "ready" if ready else "not ready"
    body["checks"]["broker"] = {"ok": broker.ok, "detail": broker.detail}
    # Open delivery alerts are for operators; they do not make the instance unready.
    body["alerts"] = open_alerts()
    response = JsonResponse(body, status=200 if ready else 503)
    if not ready:
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response
