"""Celery jobs of the webhooks app (thin: ids in, services do the work)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from a2a_platform.side_effects import send_job
from webhooks.delivery import delivery_claim_head, delivery_record, due_configs
from webhooks.services import DELIVER_CONFIG_JOB
from webhooks.transport import post

MAX_PER_RUN = 100


@shared_task(name=DELIVER_CONFIG_JOB)
def deliver_config_job(config_pk: int) -> str:
    """Deliver a config's due deliveries in order, one at a time, until one must wait."""
    sent = 0
    while sent < MAX_PER_RUN:
        claim = delivery_claim_head(config_pk=config_pk)
        if claim is None:
            return f"sent {sent}"
        result = post(
            claim.url, claim.body, claim.headers, timeout=settings.A2A_WEBHOOK_TIMEOUT_SECONDS
        )
        outcome = delivery_record(claim=claim, result=result)
        sent += 1
        if outcome.state not in ("delivered", "dead"):
            return f"sent {sent}, then {outcome.state}"
    send_job(DELIVER_CONFIG_JOB, [config_pk])  # a long backlog: yield to other configs
    return f"sent {sent}, more queued"


@shared_task(name="webhooks.sweep_deliveries")
def sweep_deliveries_job() -> int:
    """Safety net: re-enqueue every config whose head delivery is due."""
    configs = due_configs()
    for config_pk in configs:
        send_job(DELIVER_CONFIG_JOB, [config_pk])
    return len(configs)


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
