"""When a failed delivery is tried again: the retry decision, pure (no Django, no database).

Saleor's rule, with a schedule of its own for auth rejections: network errors, 5xx, 408 and
429 are retried on the outage schedule; 401 and 403 on the (short) auth schedule, so a
receiver that was down for hours and then rejects our signature still gets its auth retries,
and auth retries do not use up the outage schedule; an unsafe destination (`ssrf`), an
unbuildable request (`request`), other 4xx and 3xx are final. A schedule lists the waits
between tries; each wait is jittered by ±20% and stretched to the receiver's Retry-After
(capped at a day). webhooks/delivery/claim_record.py counts the tries and writes the outcome.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

AUTH_REJECTED = (401, 403)
# Transport errors that no retry can fix (webhooks/delivery/transport.py's error classes).
FINAL_ERRORS = ("ssrf", "request")
MAX_RETRY_AFTER_SECONDS = 86400.0


@dataclass(frozen=True)
class Retry:
    wait: float  # seconds until the next try


@dataclass(frozen=True)
class Dead:
    reason: str  # "final": not retryable; "exhausted": its schedule is used up


def jitter(seconds: float) -> float:
    return seconds * random.uniform(0.8, 1.2)  # not cryptographic


def is_auth_rejection(status: int | None) -> bool:
    return status in AUTH_REJECTED


def max_tries(schedule: Sequence[float]) -> int:
    """How many tries a run gets on `schedule`: the first, and one after each of its waits.
    The one home of that number: `decide` dead-letters the try that reaches it, and the
    admin's "attempt n of m" shows it for the outage schedule."""
    return len(schedule) + 1


def decide(
    *,
    status: int | None,
    error_class: str | None,
    retry_after: float | None,
    attempts: int,
    earlier_auth_rejections: int,
    schedule: Sequence[float],
    auth_schedule: Sequence[float],
    spread: Callable[[float], float] = jitter,
) -> Retry | Dead:
    """Retry (in how many seconds) or dead-letter a failed try.

    `attempts` counts this run's tries, this one included (since the delivery was created or
    replayed); `earlier_auth_rejections` how many of the earlier ones were answered 401/403.
    """
    tries = attempts - earlier_auth_rejections  # this kind's tries, this one included
    if is_auth_rejection(status):
        tries = earlier_auth_rejections + 1
        waits = auth_schedule
    elif status is None and error_class in FINAL_ERRORS:
        return Dead("final")
    elif status is None or status >= 500 or status in (408, 429):
        waits = schedule
    else:
        return Dead("final")  # other 4xx and 3xx
    if tries >= max_tries(waits):
        return Dead("exhausted")
    wait = spread(waits[tries - 1])
    if retry_after is not None:
        wait = max(wait, min(retry_after, MAX_RETRY_AFTER_SECONDS))
    return Retry(wait)
