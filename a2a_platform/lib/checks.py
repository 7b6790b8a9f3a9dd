"""The named checks that readiness (agents/readiness.py) and `/readyz` report."""

from __future__ import annotations

from dataclasses import dataclass

from celery import current_app
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor


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
    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            transport = conn.transport_cls
    except Exception as exc:
        return Check("broker", False, f"unreachable: {exc.__class__.__name__}")
    return Check("broker", True, str(transport))
