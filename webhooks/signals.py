"""Signal receivers of the webhooks app: a starting worker registers for the readiness gate
(webhooks.services.worker_register: its due backlog re-enqueued first)."""

from __future__ import annotations

import logging

from celery.signals import worker_ready

logger = logging.getLogger(__name__)


@worker_ready.connect
def _on_worker_ready(sender=None, **kwargs) -> None:
    from webhooks.services import worker_register

    try:
        worker_register(
            hostname=sender.hostname, queues=sorted(sender.app.amqp.queues.consume_from or [])
        )
    except Exception:
        logger.exception("worker start-up registration failed; the next heartbeat retries")
