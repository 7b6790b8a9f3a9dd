"""The one way to start a Celery job from a write: after the transaction commits.

A failed publish is logged, not raised: the row that asked for the job is already durable and
a beat sweeper re-enqueues it, so a broker outage delays work and never fails the request.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def send_job(
    name: str,
    args: list[Any],
    *,
    countdown: float | None = None,
    kwargs: dict[str, Any] | None = None,
) -> bool:
    """Publish job `name` now; False (logged) when the broker refused it."""
    try:
        # The project's app (a2a_platform/celery.py), current once the project package is
        # imported: a library module names no app of the project.
        current_app.send_task(
            name,
            args=args,
            kwargs=kwargs,
            countdown=countdown,
            retry=True,
            retry_policy=_RETRY_POLICY,
        )
    except Exception:
        logger.warning(
            "job publish failed; the sweeper will retry", extra={"job": name}, exc_info=True
        )
        return False
    return True


def enqueue_on_commit(
    name: str,
    args: list[Any],
    *,
    countdown: float | None = None,
    kwargs: dict[str, Any] | None = None,
) -> None:
    """Publish job `name` once the current transaction commits (at once outside one)."""
    transaction.on_commit(
        lambda: send_job(name, args, countdown=countdown, kwargs=kwargs), robust=True
    )
