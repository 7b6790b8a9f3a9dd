"""The one way to start a Celery job from a write: after the transaction commits.

A failed publish is logged, not raised: the row that asked for the job is already durable and
a beat sweeper re-enqueues it, so a broker outage delays work and never fails the request.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

logger = logging.getLogger(__name__)

_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def send_job(name: str, args: list[Any], *, countdown: float | None = None) -> bool:
    from a2a_platform.celery import app

    try:
        app.send_task(name, args=args, countdown=countdown, retry=True, retry_policy=_RETRY_POLICY)
    except Exception:
        logger.warning(
            "job publish failed; the sweeper will retry", extra={"job": name}, exc_info=True
        )
        return False
    return True


def enqueue_on_commit(name: str, args: list[Any], *, countdown: float | None = None) -> None:
    transaction.on_commit(lambda: send_job(name, args, countdown=countdown), robust=True)
