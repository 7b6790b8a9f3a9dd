"""The pumps' bell: one broker message per burst of work, not one per event.

Every write that makes a delivery due (an event's outbox row, a registration's snapshot, a
delivered or dead head whose successor is now due while no pump claims, an endpoint resumed,
a replay) rings the bell after its commit (`ring_on_commit`, or `ring()`). A pump
(webhooks/delivery/pump.py) that is about to claim watches the bell (`watch`: its token in a
Redis key with a short TTL) and releases it before it stops claiming or blocks; a ring
publishes a job only when nobody watches the bell. So:

- the bell watched by a claiming pump: that pump claims again, after this commit (it
  re-claims after every release), so no message is needed;
- the bell not watched: the ring makes it name the job (`JOB_TOKEN`) and publishes that one
  job; later rings find it named and rely on that job, whose pump watches it as it claims.

A bell whose pump died expires after `A2A_WEBHOOK_WAKE_TTL_SECONDS`; the sweeper rings
whenever something is due, so a lost ring delays work, never loses it. Without a Redis broker
(the embedded file-system broker of `make run`) there is no bell and every ring publishes.

A claiming pump does not wait for its next poll to see new work: a ring that finds the bell
watched is published on a Redis channel naming the watching pump (one round trip with the
bell check: a script), and each worker process keeps one subscriber (`listen`) that passes
the rings it hears to its pumps at once; only the named pump claims for it, so N workers do
not make N claims per event. A pump releases only the bell that names its own token. A ring
heard only shortens the wait; a pump that misses one (subscriber reconnecting, or another
pump took the bell over) finds the work at its next poll. The bell, its script and the
channel are the doorbell's (a2a_platform/lib/doorbell.py), which the quick executors' drain
watches the same way.
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

# The pumps' bell (a2a_platform/lib/doorbell.py): it names the claiming pump.
BELL_KEY = doorbell.key(DELIVER_JOB)
# The bell's token while a published job has not started claiming yet.
JOB_TOKEN = doorbell.JOB_TOKEN


def _ttl() -> float:
    return settings.A2A_WEBHOOK_WAKE_TTL_SECONDS


def watch(token: str = JOB_TOKEN) -> None:
    """A pump (`token`) is about to claim: writes committed from now on need no message, and
    their rings reach this pump."""
    doorbell.watch(DELIVER_JOB, token, ttl=_ttl())


def watching(token: str) -> bool:
    """Whether the bell still names this pump (False without Redis or when unreadable)."""
    return doorbell.watching(DELIVER_JOB, token)


def release(token: str = JOB_TOKEN) -> None:
    """The pump stops claiming (it blocks, drains or exits): writes need a message again.
    The caller claims once more after this, for what was committed while it watched the bell."""
    doorbell.release(DELIVER_JOB, token)


def ring(*, force: bool = False, countdown: float | None = None) -> bool:
    """Make sure a pump will claim after this point (after `countdown` seconds: a retry's or a
    capped endpoint's hint). `force` publishes whoever watches the bell (a starting worker).
    Timed rings coalesce too: one per quarter second of due time."""
    client = None if force else doorbell.broker_redis()
    if client is not None:
        if countdown is None:
            # Nobody watched the bell: it now names the job published below. Else the pump
            # watching it hears this ring (or a job is on its way).
            if not doorbell.ring(DELIVER_JOB, ttl=_ttl()):
                return True
        else:
            bucket = math.ceil((time.time() + countdown) * 4)
            try:
                claimed = client.set(
                    f"{BELL_KEY}:at:{bucket}", b"1", px=int((countdown + 1) * 1000), nx=True
                )
            except Exception:
                logger.warning("wake flag unreadable; publishing", exc_info=True)
                claimed = True
            if not claimed:
                return True  # one is due then anyway
    if send_job(DELIVER_JOB, [], countdown=countdown):
        return True
    if client is not None and countdown is None:
        release(JOB_TOKEN)  # no job carries this bell: let the next write try again
    return False


class _RingOnCommit:
    def __init__(self, countdown: float | None) -> None:
        self.countdown = countdown

    def __call__(self) -> None:
        ring(countdown=self.countdown)


def ring_on_commit(*, countdown: float | None = None) -> None:
    """`ring()` once the current transaction commits (at once outside one): once per
    transaction and countdown, however many events it wrote (each ring is a Redis round trip
    and, while a pump claims, a ring it hears and claims for). A ring registered in a
    savepoint that rolls back goes with it, so a later one registers again."""
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        for _, pending, _ in connection.run_on_commit:  # Django's (savepoints, func, robust)
            if isinstance(pending, _RingOnCommit) and pending.countdown == countdown:
                return
    transaction.on_commit(_RingOnCommit(countdown), robust=True)


# --- rings heard ----------------------------------------------------------------------------


def listen(callback: Callable[[bytes], None]) -> bool:
    """Call `callback(token)` whenever a ring is heard (a2a_platform/lib/doorbell.py); False
    without Redis (nothing is heard: the caller polls)."""
    return doorbell.listen(callback)


def unlisten(callback: Callable[[bytes], None]) -> None:
    doorbell.unlisten(callback)
