"""One delivery at a time, for tests that step the outbox by hand: the pump claims and records
in batches (`delivery_claim_batch`, `delivery_record_many`), these take one; and the
transport's connections closed between tests."""

from __future__ import annotations

import asyncio
import os

from webhooks.delivery import transport
from webhooks.delivery.claim_record import (
    DeliveryClaim,
    Outcome,
    delivery_claim_batch,
    delivery_record_many,
)
from webhooks.delivery.transport import TransportResult


def delivery_claim_head(*, config_pk: int) -> DeliveryClaim | None:
    """Claim the head delivery of one config, or None (nothing due, in flight, paused, the
    endpoint at its in-flight cap, or another claimer has the config locked)."""
    batch = delivery_claim_batch(limit=1, config_pks=[config_pk])
    return batch.claims[0] if batch.claims else None


def delivery_record(*, claim: DeliveryClaim, result: TransportResult) -> Outcome:
    """Record one attempt's result and decide: delivered, retry later, or dead-letter."""
    return delivery_record_many([(claim, result)])[0]


def close_client() -> None:
    """Close this process's webhook connections, so the next send opens a new one (a
    worker's connections end with its process)."""
    sender = transport._current
    if sender is not None and sender.pid == os.getpid():
        asyncio.run_coroutine_threadsafe(sender.close_session(), sender.loop).result(timeout=10)
