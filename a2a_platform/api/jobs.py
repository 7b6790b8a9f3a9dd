"""Beat job of the management API: purge Idempotency-Key claims older than 24 hours."""

from __future__ import annotations

from celery import shared_task

from a2a_platform.api import services

PURGE_IDEMPOTENCY_KEYS_JOB = "platform_api.purge_idempotency_keys"


@shared_task(name=PURGE_IDEMPOTENCY_KEYS_JOB)
def purge_idempotency_keys_job() -> int:
    return services.idempotency_purge()
