"""A wake flag: one broker message per burst of work for a draining job, and nudges for the job
that is draining now.

Every write that gives the job work calls `wake()` after its commit. A job that is about to
claim holds the flag, a Redis key with a short TTL naming it (its token), and releases it
before it stops claiming; `wake()` publishes a job only when it could set the flag itself. So:

- flag held by a claiming job: that job claims again after this commit (it claims once more
  after every release), so no message is needed, and the write nudges it;
- flag not held: `wake()` sets it (to `JOB_TOKEN`: a job is on its way) and publishes one job;
  later writes find it set and rely on that job, which takes the flag over as it starts.

A flag whose job died expires after its TTL; the owners' sweepers find what is due, so a lost
wake delays work, never loses it. Without a Redis broker (the embedded file-system broker of
`make run`) there is no flag and every wake publishes.

A nudge is a message naming the holder on the flag's Redis channel, published by the wake
that found the flag held (one round trip with the check: a script). Each process keeps one
subscriber per flag (`listen`) that passes nudges to its listeners at once; a listener acts
only on its own token, so N processes do not make N claims per write. The nudge only
shortens the wait: a job that misses one (subscriber reconnecting) finds the work at its next
poll. Users: the delivery pump (webhooks/wake.py) and the quick executors' runner
(tasks/dispatch.py).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable

from django.db import transaction

from a2a_platform.lib.doorbell import broker_redis
from a2a_platform.lib.on_commit import send_job

logger = logging.getLogger(__name__)

JOB_TOKEN = "job"  # the flag's value while a published job has not started claiming yet

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
# A starting job takes the flag when nobody holds it or it only says a job is on its way.
_TAKE_SCRIPT = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[2] then
    return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
"""
# Only the holder extends the flag's life (a job whose flag lapsed and was taken over stops).
_REFRESH_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# Only the holder clears the flag (another job may have taken it over since).
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class WakeFlag:
    """The flag `key` for job `job`, nudges on `channel`; `ttl()` seconds, read at use."""

    def __init__(self, key: str, channel: str, job: str, ttl: Callable[[], float]) -> None:
        self.key = key
        self.channel = channel
        self.job = job
        self._ttl = ttl
        self._lock = threading.Lock()
        self._listeners: set[Callable[[bytes], None]] = set()
        self._listener_pid: int | None = None

    def _ttl_ms(self) -> int:
        return int(self._ttl() * 1000)

    def hold(self, token: str = JOB_TOKEN) -> None:
        """A job (`token`) is about to claim: writes committed from now on need no message,
        and nudge this job. Also the holder's refresh, well within the TTL."""
        client = broker_redis()
        if client is None:
            return
        try:
            client.set(self.key, token.encode(), px=self._ttl_ms())
        except Exception:
            logger.warning("wake flag not set", extra={"flag": self.key}, exc_info=True)

    def take(self, token: str) -> bool:
        """Hold the flag unless another job holds it (a flag saying only that a job is on its
        way is this job's). False without Redis or when unreadable: no nudges for this job."""
        client = broker_redis()
        if client is None:
            return False
        try:
            script = (_TAKE_SCRIPT, 1, self.key, token.encode(), JOB_TOKEN, self._ttl_ms())
            return bool(client.eval(*script))
        except Exception:
            logger.warning("wake flag not taken", extra={"flag": self.key}, exc_info=True)
            return False

    def refresh(self, token: str) -> bool:
        """Extend this job's hold, well within the TTL. False: another job holds the flag now
        (this one's lapsed), or Redis refused: stop relying on nudges."""
        client = broker_redis()
        if client is None:
            return False
        try:
            return bool(client.eval(_REFRESH_SCRIPT, 1, self.key, token.encode(), self._ttl_ms()))
        except Exception:
            logger.warning("wake flag not refreshed", extra={"flag": self.key}, exc_info=True)
            return False

    def holds(self, token: str) -> bool:
        """Whether the flag still names this job (False without Redis or when unreadable)."""
        client = broker_redis()
        if client is None:
            return False
        try:
            return client.get(self.key) == token.encode()
        except Exception:
            logger.warning("wake flag unreadable", extra={"flag": self.key}, exc_info=True)
            return False

    def release(self, token: str = JOB_TOKEN) -> None:
        """The job stops claiming (it blocks, drains or exits): writes need a message again.
        The caller claims once more after this, for what was committed while it held the flag."""
        client = broker_redis()
        if client is None:
            return
        try:
            client.eval(_RELEASE_SCRIPT, 1, self.key, token.encode())
        except Exception:
            logger.warning("wake flag not cleared", extra={"flag": self.key}, exc_info=True)

    def wake(self, *, force: bool = False, countdown: float | None = None) -> bool:
        """Make sure a job will claim after this point (after `countdown` seconds: a retry's
        hint). `force` publishes regardless of the flag (a starting worker, a handover). Timed
        wakes coalesce too: one per quarter second of due time. False: the broker refused."""
        client = None if force else broker_redis()
        if client is not None:
            key, ttl_ms = self.key, self._ttl_ms()
            if countdown is not None:
                bucket = math.ceil((time.time() + countdown) * 4)
                key, ttl_ms = f"{self.key}:at:{bucket}", int(countdown * 1000) + 1000
            try:
                if countdown is None:
                    script = (_WAKE_SCRIPT, 2, key, self.channel, JOB_TOKEN, ttl_ms)
                    claimed = client.eval(*script)
                else:
                    claimed = client.set(key, b"1", px=ttl_ms, nx=True)
                if not claimed:
                    return True  # a job is claiming (and was nudged), or one is due then anyway
            except Exception:
                logger.warning("wake flag unreadable; publishing", extra={"flag": self.key})
                client = None
        if send_job(self.job, [], countdown=countdown):
            return True
        if client is not None and countdown is None:
            self.release(JOB_TOKEN)  # no job carries this flag: let the next write try again
        return False

    def wake_on_commit(self, *, countdown: float | None = None) -> None:
        """`wake()` once the current transaction commits (at once outside one): once per
        transaction and countdown, however many writes it made (each wake is a Redis round
        trip and, while a job claims, a nudge it claims for). A wake registered in a
        savepoint that rolls back goes with it, so a later one registers again."""
        connection = transaction.get_connection()
        if connection.in_atomic_block:
            for _, pending, _ in connection.run_on_commit:  # Django's (savepoints, func, robust)
                if (
                    isinstance(pending, _WakeOnCommit)
                    and pending.flag is self
                    and pending.countdown == countdown
                ):
                    return
        transaction.on_commit(_WakeOnCommit(self, countdown), robust=True)

    # --- nudges ----------------------------------------------------------------------------

    def listen(self, callback: Callable[[bytes], None]) -> bool:
        """Call `callback(holder)` (from the subscriber thread) whenever a nudge arrives, until
        `unlisten(callback)`; `holder` is the token of the job it is for. Starts this
        process's subscriber on first use. False without Redis (no nudges: the caller polls)."""
        if broker_redis() is None:
            return False
        with self._lock:
            self._listeners.add(callback)
            if self._listener_pid != os.getpid():
                self._listener_pid = os.getpid()
                threading.Thread(
                    target=self._subscribe, name=f"nudges:{self.channel}", daemon=True
                ).start()
        return True

    def unlisten(self, callback: Callable[[bytes], None]) -> None:
        with self._lock:
            self._listeners.discard(callback)

    def _subscribe(self) -> None:
        """Forever: hold a subscription to the nudge channel; reconnect after a failure."""
        import redis
        from django.conf import settings

        while True:
            try:
                client = redis.Redis.from_url(
                    settings.CELERY_BROKER_URL, socket_connect_timeout=2, health_check_interval=10
                )
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                while True:
                    message = pubsub.get_message(timeout=5.0)
                    if message is not None:
                        with self._lock:
                            waiting = list(self._listeners)
                        for callback in waiting:
                            callback(message["data"])
            except Exception:
                logger.warning(
                    "nudge subscription lost; its jobs poll until it is back",
                    extra={"channel": self.channel},
                )
                time.sleep(1.0)


class _WakeOnCommit:
    def __init__(self, flag: WakeFlag, countdown: float | None) -> None:
        self.flag = flag
        self.countdown = countdown

    def __call__(self) -> None:
        self.flag.wake(countdown=self.countdown)
