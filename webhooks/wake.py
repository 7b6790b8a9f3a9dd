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

A claiming pump does not wait for its next poll to see new work: a wake that finds the flag
held publishes a nudge naming the holder on a Redis channel (one round trip with the flag
check: a script), and each worker process keeps one subscriber (`listen`) that passes
nudges to its pumps at once; only the named pump claims for it, so N workers do not make N
claims per event. The flag holds the pump's token, and a pump releases only its own flag.
The nudge only shortens the wait; a pump that misses one (subscriber reconnecting, or
another pump took the flag over) finds the work at its next poll.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import transaction

from a2a_platform.lib.doorbell import broker_redis
from a2a_platform.lib.on_commit import send_job
from webhooks.job_names import DELIVER_JOB

logger = logging.getLogger(__name__)

FLAG_KEY = "a2a:webhooks:pump-claiming"
NUDGE_CHANNEL = "a2a:webhooks:nudge"

_lock = threading.Lock()


def _ttl_ms() -> int:
    return int(settings.A2A_WEBHOOK_WAKE_TTL_SECONDS * 1000)


# One round trip for a wake: set the flag if nobody holds it (then the caller publishes a
# job), else nudge its holder.
_WAKE_SCRIPT = """
local holder = redis.call('GET', KEYS[1])
if holder then
    redis.call('PUBLISH', KEYS[2], holder)
    return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# Only the holder clears the flag (another pump may have taken it over since).
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
JOB_TOKEN = "job"  # the flag's value while a published job has not started claiming yet


def hold(token: str = JOB_TOKEN) -> None:
    """A pump (`token`) is about to claim: writes committed from now on need no message, and
    nudge this pump."""
    client = broker_redis()
    if client is None:
        return
    try:
        client.set(FLAG_KEY, token.encode(), px=_ttl_ms())
    except Exception:
        logger.warning("wake flag not set", exc_info=True)


def holds(token: str) -> bool:
    """Whether the flag still names this pump (False without Redis or when unreadable)."""
    client = broker_redis()
    if client is None:
        return False
    try:
        return client.get(FLAG_KEY) == token.encode()
    except Exception:
        logger.warning("wake flag unreadable", exc_info=True)
        return False


def release(token: str = JOB_TOKEN) -> None:
    """The pump stops claiming (it blocks, drains or exits): writes need a message again.
    The caller claims once more after this, for what was committed while it held the flag."""
    client = broker_redis()
    if client is None:
        return
    try:
        client.eval(_RELEASE_SCRIPT, 1, FLAG_KEY, token.encode())
    except Exception:
        logger.warning("wake flag not cleared", exc_info=True)


def wake(*, force: bool = False, countdown: float | None = None) -> bool:
    """Make sure a pump will claim after this point (after `countdown` seconds: a retry's or a
    capped endpoint's hint). `force` publishes regardless of the flag (a starting worker).
    Timed wakes coalesce too: one per quarter second of due time."""
    client = None if force else broker_redis()
    if client is not None:
        key, ttl_ms = FLAG_KEY, _ttl_ms()
        if countdown is not None:
            bucket = math.ceil((time.time() + countdown) * 4)
            key, ttl_ms = f"{FLAG_KEY}:at:{bucket}", int(countdown * 1000) + 1000
        try:
            if countdown is None:
                claimed = client.eval(_WAKE_SCRIPT, 2, key, NUDGE_CHANNEL, JOB_TOKEN, ttl_ms)
            else:
                claimed = client.set(key, b"1", px=ttl_ms, nx=True)
            if not claimed:
                return True  # a pump is claiming (and was nudged), or one is due then anyway
        except Exception:
            logger.warning("wake flag unreadable; publishing", exc_info=True)
            client = None
    if send_job(DELIVER_JOB, [], countdown=countdown):
        return True
    if client is not None and countdown is None:
        release(JOB_TOKEN)  # no job carries this flag: let the next write try again
    return False


class _WakeOnCommit:
    def __init__(self, countdown: float | None) -> None:
        self.countdown = countdown

    def __call__(self) -> None:
        wake(countdown=self.countdown)


def wake_on_commit(*, countdown: float | None = None) -> None:
    """`wake()` once the current transaction commits (at once outside one): once per
    transaction and countdown, however many events it wrote (each wake is a Redis round trip
    and, while a pump claims, a nudge it claims for). A wake registered in a savepoint that
    rolls back goes with it, so a later one registers again."""
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        for _, pending, _ in connection.run_on_commit:  # Django's (savepoints, func, robust)
            if isinstance(pending, _WakeOnCommit) and pending.countdown == countdown:
                return
    transaction.on_commit(_WakeOnCommit(countdown), robust=True)


# --- nudges --------------------------------------------------------------------------------

_listeners: set[Callable[[bytes], None]] = set()
_listener_pid: int | None = None


def listen(callback: Callable[[bytes], None]) -> bool:
    """Call `callback(holder)` (from the subscriber thread) whenever a nudge arrives, until
    `unlisten(callback)`; `holder` is the token of the pump it is for. Starts this process's
    subscriber on first use. False without Redis (no nudges: the caller polls)."""
    global _listener_pid
    if broker_redis() is None:
        return False
    with _lock:
        _listeners.add(callback)
        if _listener_pid != os.getpid():
            _listener_pid = os.getpid()
            threading.Thread(target=_subscribe, name="webhook-nudges", daemon=True).start()
    return True


def unlisten(callback: Callable[[bytes], None]) -> None:
    with _lock:
        _listeners.discard(callback)


def _subscribe() -> None:
    """Forever: hold a subscription to the nudge channel; reconnect after a failure."""
    import redis

    url = settings.CELERY_BROKER_URL
    while True:
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=2, health_check_interval=10)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(NUDGE_CHANNEL)
            while True:
                message = pubsub.get_message(timeout=5.0)
                if message is not None:
                    with _lock:
                        waiting = list(_listeners)
                    for callback in waiting:
                        callback(message["data"])
        except Exception:
            logger.warning("webhook nudge subscription lost; pumps poll until it is back")
            time.sleep(1.0)
