"""A doorbell: many writes that each want the same draining job, one job published.

`ring(name)` says whether the caller should publish job `name`: True when no such job is
known to be waiting, that is when nobody rang since the last job cleared the bell. The job
clears the bell (`clear(name)`) before it looks for work, so work committed before a ring
that found the bell set is seen by that look, and work committed after the clear rings
again. A ring is one Redis command (SET NX with an expiry), against a job publish through
Celery's machinery (docs/decisions.md, "Throughput").

The bell lives in the broker's Redis (`broker_redis`, the client webhooks/wake.py's flag uses
too) and expires after `RING_SECONDS`, so a job lost with its worker stops swallowing rings
that soon; the work it would have drained is durable and the sweepers re-enqueue it, as they
do a lost job of any kind. A publish the broker refused clears the bell at once
(tasks/dispatch.py `ring_for_due_dispatches`). On a broker that is not Redis
(the embedded file-system broker), or when Redis refuses the command, every ring says
publish: the behaviour without a bell.
"""

from __future__ import annotations

import logging
import os
import threading

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

RING_SECONDS = 2.0

_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}


def broker_redis() -> redis.Redis | None:
    """The broker's Redis (its database), one client per process and URL (a forked child
    makes its own: a client's sockets are not to be shared across a fork; redis-py's clients
    are safe to share between threads). None when the broker is not Redis."""
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        return None
    key = (os.getpid(), url)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = redis.Redis.from_url(
                url, socket_timeout=2, socket_connect_timeout=2
            )
        return client


def _bell(name: str) -> tuple[redis.Redis, str] | None:
    client = broker_redis()
    return None if client is None else (client, f"a2a:doorbell:{name}")


def ring(name: str) -> bool:
    """True: publish the job (the bell was not set, and now is)."""
    bell = _bell(name)
    if bell is None:
        return True
    client, key = bell
    try:
        return bool(client.set(key, b"1", nx=True, px=int(RING_SECONDS * 1000)))
    except redis.RedisError:
        logger.warning("doorbell unreachable; publishing the job", extra={"job": name})
        return True


def clear(name: str) -> None:
    """The job is running and about to look for work: the next ring publishes another."""
    bell = _bell(name)
    if bell is None:
        return
    client, key = bell
    try:
        client.delete(key)
    except redis.RedisError:
        # Still set, it expires in RING_SECONDS: rings meanwhile publish nothing, and what
        # they announce waits for the next ring after it or for the sweeper.
        logger.warning("doorbell not cleared", extra={"job": name}, exc_info=True)
