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
another pump took the flag over) finds the work at its next poll. The flag, its script and
the nudges are the doorbell's (a2a_platform/lib/doorbell.py), which the quick executors'
drain holds the same way.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from django.conf import settings
from django.db import transaction

from a2a_platform.lib import doorbell
from a2a_platform.lib.on_commit import send_job
from webhooks.job_names import DELIVER_JOB

logger = logging.getLogger(__name__)

# The pumps' bell (a2a_platform/lib/doorbell.py): its holder is the claiming pump.
FLAG_KEY = doorbell.key(DELIVER_JOB)
# The flag's value while a published job has not started claiming yet.
JOB_TOKEN = doorbell.JOB_TOKEN


def _ttl() -> float:
    return settings.A2A_WEBHOOK_WAKE_TTL_SECONDS


def hold(token: str = JOB_TOKEN) -> None:
    """A pump (`token`) is about to claim: writes committed from now on need no message, and
    nudge this pump."""
    doorbell.hold(DELIVER_JOB, token, ttl=_ttl())


def holds(token: str) -> bool:
    """Whether the flag still names this pump (False without Redis or when unreadable)."""
    return doorbell.holds(DELIVER_JOB, token)


def release(token: str = JOB_TOKEN) -> None:
    """The pump stops claiming (it blocks, drains or exits): writes need a message again.
    The caller claims once more after this, for what was committed while it held the flag."""
    doorbell.release(DELIVER_JOB, token)


def wake(*, force: bool = False, countdown: float | None = None) -> bool:
    """Make sure a pump will claim after this point (after `countdown` seconds: a retry's or a
    capped endpoint's hint). `force` publishes regardless of the flag (a starting worker).
    Timed wakes coalesce too: one per quarter second of due time."""
    client = None if force else doorbell.broker_redis()
    if client is not None:
        if countdown is None:
            # Nobody holds the flag: it is now held for the job published below. Else its
            # holder was nudged (or a job is on its way).
            if not doorbell.ring(DELIVER_JOB, ttl=_ttl()):
                return True
        else:
            bucket = math.ceil((time.time() + countdown) * 4)
            try:
                claimed = client.set(
                    f"{FLAG_KEY}:at:{bucket}", b"1", px=int((countdown + 1) * 1000), nx=True
                )
            except Exception:
                logger.warning("wake flag unreadable; publishing", exc_info=True)
                claimed = True
            if not claimed:
                return True  # one is due then anyway
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


def listen(callback: Callable[[bytes], None]) -> bool:
    """Call `callback(holder)` whenever a nudge arrives (a2a_platform/lib/doorbell.py); False
    without Redis (no nudges: the caller polls)."""
    return doorbell.listen(callback)


def unlisten(callback: Callable[[bytes], None]) -> None:
    doorbell.unlisten(callback)
