"""Celery jobs of the webhooks app (thin: ids in, services do the work)."""

from __future__ import annotations

from celery import shared_task

from webhooks.pump import run_pump
from webhooks.selectors import due_configs
from webhooks.wake import DELIVER_JOB, wake


@shared_task(name=DELIVER_JOB)
def deliver_job() -> str:
    """Run one delivery pump (webhooks/pump.py): claim, send and record what is due."""
    run = run_pump()
    return f"claimed {run.claimed}, delivered {run.delivered}"


@shared_task(name="webhooks.sweep_deliveries")
def sweep_deliveries_job() -> int:
    """Safety net: wake a pump when a head is due (lost wake-ups, dead workers, retries whose
    hint was lost with its worker). No message when a pump is claiming anyway. Also vacuums
    the queue tables when they need it (webhooks/maintenance.py)."""
    from webhooks.heads import repair
    from webhooks.maintenance import vacuum_queue_tables

    vacuum_queue_tables()
    repair()
    due = len(due_configs(limit=1))
    if due:
        wake()
    return due


@shared_task(name="webhooks.purge_old_rows")
def purge_old_rows_job() -> dict:
    from webhooks.retention import purge_old_rows

    purged = purge_old_rows()
    return {"deliveries": purged.deliveries, "events": purged.events}


@shared_task(name="heartbeat.beat", bind=True)
def heartbeat_job(self) -> str:
    """Beat → broker (`heartbeat` queue) → this worker → the database: the proof of life the
    readiness gate reads (agents/readiness.py). A worker whose row is missing, or whose
    start-up backlog re-enqueue failed, registers again, re-enqueueing its backlog first."""
    from agents.readiness import heartbeat
    from webhooks.signals import register_worker

    hostname = self.request.hostname or "unknown"
    if not heartbeat(hostname=hostname):
        register_worker(self.app, hostname)
        heartbeat(hostname=hostname)
        return "registered"
    return "beat"
