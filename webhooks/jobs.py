"""Celery jobs of the webhooks app (thin: ids in, one service does the work)."""

from __future__ import annotations

from celery import shared_task

from webhooks.delivery.pump import run_pump
from webhooks.job_names import (
    CARD_AGE_CHECK_JOB,
    DELIVER_JOB,
    HEARTBEAT_JOB,
    PURGE_OLD_ROWS_JOB,
    REBIND_FIRE_JOB,
    REBIND_MONITOR_JOB,
    SWEEP_DELIVERIES_JOB,
)


@shared_task(name=DELIVER_JOB)
def deliver_job() -> str:
    """Run one delivery pump (webhooks/delivery/pump.py): claim, send and record what is due."""
    run = run_pump()
    return f"claimed {run.claimed}, delivered {run.delivered}"


@shared_task(name=SWEEP_DELIVERIES_JOB)
def sweep_deliveries_job() -> int:
    """The outbox's safety net (webhooks.services.delivery_sweep)."""
    from webhooks.services import delivery_sweep

    return delivery_sweep()


@shared_task(name=PURGE_OLD_ROWS_JOB)
def purge_old_rows_job() -> dict:
    from webhooks.delivery.retention import purge_old_rows

    purged = purge_old_rows()
    return {"deliveries": purged.deliveries, "events": purged.events}


@shared_task(name=HEARTBEAT_JOB, bind=True)
def heartbeat_job(self) -> str:
    """Beat → broker (`heartbeat` queue) → this worker → the database: the proof of life the
    readiness gate reads (webhooks.services.worker_heartbeat)."""
    from webhooks.services import worker_heartbeat

    registered = worker_heartbeat(
        hostname=self.request.hostname or "unknown", queues=_consumed_queues(self.app)
    )
    return "registered" if registered else "beat"


def _consumed_queues(app) -> list[str]:
    return sorted(app.amqp.queues.consume_from or [])


@shared_task(name=REBIND_MONITOR_JOB)
def rebind_monitor_job() -> int:
    """Advance every open rebind (webhooks.rebinds.operations.rebind_monitor); idempotent."""
    from webhooks.rebinds.operations import rebind_monitor

    return rebind_monitor()


@shared_task(name=REBIND_FIRE_JOB)
def rebind_fire_job(rebind_pk: str) -> str:
    """A scheduled rebind's one-off clocked job: start it (the monitor is the backstop)."""
    from webhooks.rebinds.operations import rebind_fire

    return rebind_fire(rebind_pk).state


@shared_task(name=CARD_AGE_CHECK_JOB)
def card_age_check_job() -> int:
    """Alert when an agent's tasks outlive its card (webhooks.alerts.card_age_check)."""
    from webhooks.alerts import card_age_check

    return card_age_check()
