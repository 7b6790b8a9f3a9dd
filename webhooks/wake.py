"""Waking the delivery pump: one broker message per burst of work, not one per event.

Every write that makes a delivery due (an event's outbox row, a registration's snapshot, a
delivered or dead head whose successor is now due while no pump claims, an endpoint resumed,
a replay) calls `wake()` after its commit. A pump (webhooks/pump.py) that is about to claim
holds the wake flag, a Redis key with a short TTL, and releases it before it stops claiming
or blocks; `wake()` publishes a job only when it could set the flag itself. So:

- flag held by a claiming pump: that pump claims again, after this commit (it re-claims
  after every release), so no message is needed;
- flag not held: `wake()` sets it and publishes one job; later writes find it set and rely on
  that job, which clears it as it claims.

A flag whose pump died expires after `A2A_WEBHOOK_WAKE_TTL_SECONDS`; the sweeper wakes a pump
whenever something is due, so a lost wake delays work, never loses it. Without a Redis broker
(the embedded file-system broker of `make run`) there is no flag and every wake publishes.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time

from django.conf import settings
from django.db import transaction

from a2a_platform.side_effects import send_job

logger = logging.getLogger(__name__)

DELIVER_JOB = "webhooks.deliver"
FLAG_KEY = "a2a:webhooks:pump-claiming"

_lock = threading.Lock()
_client = None
_client_pid: int | None = None


def _redis():
    """The broker's Redis (same database), one client per process; None without Redis."""
    global _client, _client_pid
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        return None
    with _lock:
        if _client is None or _client_pid != os.getpid():
            import redis

            _client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
            _client_pid = os.getpid()
        return _client


def _ttl_ms() -> int:
    return int(settings.A2A_WEBHOOK_WAKE_TTL_SECONDS * 1000)


def hold() -> None:
    """A pump is about to claim: writes committed from now on need no message."""
    client = _redis()
    if client is None:
        return
    try:
        client.set(FLAG_KEY, b"1", px=_ttl_ms())
    except Exception:
        logger.warning("wake flag not set", exc_info=True)


def release() -> None:
    """The pump stops claiming (it blocks, drains or exits): writes need a message again.
    The caller claims once more after this, for what was committed while it held the flag."""
    client = _redis()
    if client is None:
        return
    try:
        client.delete(FLAG_KEY)
    except Exception:
        logger.warning("wake flag not cleared", exc_info=True)


def wake(*, force: bool = False, countdown: float | None = None) -> bool:
    """Make sure a pump will claim after this point (after `countdown` seconds: a retry's or a
    capped endpoint's hint). `force` publishes regardless of the flag (a starting worker).
    Timed wakes coalesce too: one per quarter second of due time."""
    client = None if force else _redis()
    if client is not None:
        key, ttl_ms = FLAG_KEY, _ttl_ms()
        if countdown is not None:
            bucket = math.ceil((time.time() + countdown) * 4)
            key, ttl_ms = f"{FLAG_KEY}:at:{bucket}", int(countdown * 1000) + 1000
        try:
            if not client.set(key, b"1", px=ttl_ms, nx=True):
                return True  # a pump is claiming, or one is due then anyway
        except Exception:
            logger.warning("wake flag unreadable; publishing", exc_info=True)
            client = None
    if send_job(DELIVER_JOB, [], countdown=countdown):
        return True
    if client is not None and countdown is None:
        release()  # no job carries this flag: let the next write try again
    return False


def wake_on_commit(*, countdown: float | None = None) -> None:
    """`wake()` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: wake(countdown=countdown), robust=True)
