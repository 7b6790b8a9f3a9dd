"""A starting worker wakes a delivery pump for its due backlog, then registers for the
readiness gate.

Retries a dead worker held in memory are lost with it; the database still knows them. Only
after that re-enqueue does this worker count as a live delivery worker (agents/readiness.py).
"""

from __future__ import annotations

import logging

from celery.signals import worker_ready

from a2a_platform.lib.on_commit import send_job

logger = logging.getLogger(__name__)


def register_worker(app, hostname: str) -> None:
    """Re-enqueue what is due for the queues this worker consumes, then record it for the
    readiness gate (a delivery worker counts only once its backlog was re-enqueued)."""
    from agents.readiness import worker_started
    from webhooks.selectors import due_configs
    from webhooks.wake import wake

    queues = sorted(app.amqp.queues.consume_from or [])
    reenqueued = True
    if "webhooks" in queues and due_configs(limit=1):
        # A flag left by a pump that died with a previous worker must not hold this one back.
        reenqueued = wake(force=True) and reenqueued
    if "agents" in queues or "heartbeat" in queues:
        reenqueued = send_job("tasks.sweep_dispatches", []) and reenqueued
    worker_started(hostname=hostname, queues=queues, backlog_reenqueued=reenqueued)


@worker_ready.connect
def _on_worker_ready(sender=None, **kwargs) -> None:
    try:
        register_worker(sender.app, sender.hostname)
    except Exception:
        logger.exception("worker start-up registration failed; the next heartbeat retries")
