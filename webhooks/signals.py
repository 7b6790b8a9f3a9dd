"""A starting worker re-enqueues the due delivery backlog (retries it held in memory died
with the previous worker; the database still knows them)."""

from __future__ import annotations

from celery.signals import worker_ready

from a2a_platform.side_effects import send_job


@worker_ready.connect
def _reenqueue_backlog(sender=None, **kwargs) -> None:
    send_job("webhooks.sweep_deliveries", [])
