"""Waking the delivery pump: one broker message per burst of work, not one per event.

Every write that makes a delivery due (an event's outbox row, a registration's snapshot, a
delivered or dead head whose successor is now due while no pump claims, an endpoint resumed,
a replay) calls `wake()` after its commit. A pump (webhooks/pump.py) that is about to claim
holds the wake flag and releases it before it stops claiming or blocks; `wake()` publishes a
job only when it could set the flag itself, and otherwise nudges the pump that holds it. The
mechanism is a2a_platform/lib/wake_flag.py's (the quick executors' runner has a flag of its
own); this module is the delivery pump's flag, under the names the pump and the rest of
webhooks/ use.

A flag whose pump died expires after `A2A_WEBHOOK_WAKE_TTL_SECONDS`; the sweeper wakes a pump
whenever something is due, so a lost wake delays work, never loses it.
"""

from __future__ import annotations

from django.conf import settings

from a2a_platform.lib.wake_flag import JOB_TOKEN, WakeFlag
from webhooks.job_names import DELIVER_JOB

FLAG_KEY = "a2a:webhooks:pump-claiming"
NUDGE_CHANNEL = "a2a:webhooks:nudge"

_flag = WakeFlag(
    FLAG_KEY, NUDGE_CHANNEL, DELIVER_JOB, ttl=lambda: settings.A2A_WEBHOOK_WAKE_TTL_SECONDS
)

hold = _flag.hold
holds = _flag.holds
release = _flag.release
wake = _flag.wake
wake_on_commit = _flag.wake_on_commit
listen = _flag.listen
unlisten = _flag.unlisten

__all__ = [
    "FLAG_KEY",
    "JOB_TOKEN",
    "NUDGE_CHANNEL",
    "hold",
    "holds",
    "listen",
    "release",
    "unlisten",
    "wake",
    "wake_on_commit",
]
