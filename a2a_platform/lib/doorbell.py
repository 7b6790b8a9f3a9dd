"""A doorbell: many writes that each want the same draining job, one job published.

The words (docs/ARCHITECTURE.md, "Words"): a write *rings* the bell when it made work due; a
drain (a running job that claims, or lingers for more) *watches* the bell while it claims,
its token in the bell; a ring that finds the bell watched is *heard* by that drain instead of
publishing a job.

`ring(name)` says whether the caller should publish job `name`: True when nobody watches the
bell, which then names the job it is about to publish (`JOB_TOKEN`). While a drain watches
the bell (`watch(name, token)`), a ring publishes nothing and reaches that drain instead
(`listen`), in the same round trip (a script). A drain releases the bell (`release`) before
it stops claiming and then claims once more, so work committed before a ring that found the
bell watched is seen by that drain, and work committed after the release rings for a job
again. A Celery job's publish and its consumption are so paid once per burst of work, not
once per write (docs/decisions.md, "The doorbell").

The bell lives in the broker's Redis (`broker_redis`) and expires after its TTL, so a job lost
with its worker stops swallowing rings that soon; the work it would have drained is durable
and the sweepers re-enqueue it, as they do a lost job of any kind. A publish the broker
refused releases the bell at once (`release(name)`). On a broker that is not Redis (the
embedded file-system broker), or when Redis refuses the command, every ring says publish and
nobody hears one: the behaviour without a bell.

Rings heard travel on one Redis channel, whatever the bell: each names the token of the drain
it is for, and each process that listens keeps one subscriber thread, which hands a ring to
the callbacks registered in that process (each callback keeps those naming its own token).
The delivery pumps (webhooks/delivery/bell.py), the quick executors' drain
(tasks/executors/runner.py) and the hosted runs' drain (tasks/executors/host.py) ring, watch
and hear this way.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

RING_SECONDS = 2.0
# The channel rings heard travel on (its name predates the word "ring": kept as it is).
RING_CHANNEL = "a2a:doorbell:nudge"
JOB_TOKEN = "job"  # the token the bell names while a published job has not started yet

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


def key(name: str) -> str:
    return f"a2a:doorbell:{name}"


# One round trip for a ring: the bell names a job if nobody watches it (then the caller
# publishes that job), else the ring goes to the drain watching it.
_RING_SCRIPT = """
local watcher = redis.call('GET', KEYS[1])
if watcher then
    if watcher ~= ARGV[1] then
        redis.call('PUBLISH', KEYS[2], watcher)
    end
    return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
# Only the drain watching the bell releases it (another drain may watch it since).
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


def ring(name: str, *, ttl: float = RING_SECONDS) -> bool:
    """True: publish the job (nobody watched the bell; it now names that job). Else the
    drain watching the bell hears the ring, or a job is already on its way."""
    client = broker_redis()
    if client is None:
        return True
    try:
        return bool(
            client.eval(_RING_SCRIPT, 2, key(name), RING_CHANNEL, JOB_TOKEN, int(ttl * 1000))
        )
    except redis.RedisError:
        logger.warning("doorbell unreachable; publishing the job", extra={"job": name})
        return True


def watch(name: str, token: str, *, ttl: float = RING_SECONDS) -> None:
    """A drain (`token`) is about to claim: rings from now on publish nothing and reach it.
    Refresh it well within `ttl`."""
    client = broker_redis()
    if client is None:
        return
    try:
        client.set(key(name), token.encode(), px=int(ttl * 1000))
    except redis.RedisError:
        logger.warning("doorbell not held", extra={"job": name}, exc_info=True)


def watching(name: str, token: str) -> bool:
    """Whether the bell still names this drain (False without Redis or when unreadable)."""
    client = broker_redis()
    if client is None:
        return False
    try:
        return client.get(key(name)) == token.encode()
    except redis.RedisError:
        logger.warning("doorbell unreadable", extra={"job": name}, exc_info=True)
        return False


def release(name: str, token: str = JOB_TOKEN) -> None:
    """The drain stops claiming: rings publish a job again. The caller claims once more
    after this, for what was committed while it watched the bell. With JOB_TOKEN: a publish
    the broker refused gives the bell back (no job carries it)."""
    client = broker_redis()
    if client is None:
        return
    try:
        client.eval(_RELEASE_SCRIPT, 1, key(name), token.encode())
    except redis.RedisError:
        # Still watched, it expires within its TTL: rings meanwhile publish nothing, and what
        # they announce waits for the next ring after it or for the sweeper.
        logger.warning("doorbell not released", extra={"job": name}, exc_info=True)


# --- rings heard ----------------------------------------------------------------------------

_listeners: set[Callable[[bytes], None]] = set()
_listener_pid: int | None = None


def listen(callback: Callable[[bytes], None]) -> bool:
    """Call `callback(token)` (from the subscriber thread) whenever a ring is heard, until
    `unlisten(callback)`; `token` is the token of the drain it is for. Starts this process's
    subscriber on first use. False without Redis (nothing is heard: the caller polls or
    stops)."""
    global _listener_pid
    if broker_redis() is None:
        return False
    with _lock:
        _listeners.add(callback)
        if _listener_pid != os.getpid():
            _listener_pid = os.getpid()
            threading.Thread(target=_subscribe, name="doorbell-rings", daemon=True).start()
    return True


def unlisten(callback: Callable[[bytes], None]) -> None:
    with _lock:
        _listeners.discard(callback)


def _subscribe() -> None:
    """Forever: keep a subscription to the ring channel; reconnect after a failure."""
    url = settings.CELERY_BROKER_URL
    while True:
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=2, health_check_interval=10)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(RING_CHANNEL)
            while True:
                message = pubsub.get_message(timeout=5.0)
                if message is not None:
                    with _lock:
                        waiting = list(_listeners)
                    for callback in waiting:
                        callback(message["data"])
        except Exception:
            logger.warning(
                "doorbell nudge subscription lost; holders find new work at their next claim"
            )
            time.sleep(1.0)
