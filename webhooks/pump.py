"""The delivery pump: claim due heads in batches, POST them concurrently, record as they land.

One pump runs inside one `webhooks.deliver` job. It keeps up to `A2A_WEBHOOK_PUMP_WINDOW`
sends in flight on the process's sender loop (webhooks/transport.py); whenever some finish
it records them in one transaction and, when that left a successor due or its last claim
could not take everything due, claims again, so a delivered head's successor goes next
without a broker round trip, and a hung receiver holds one window slot, never the batch.
Claims, records and order are webhooks/delivery.py's; waking pumps is webhooks/wake.py's.

A pump claims for `A2A_WEBHOOK_PUMP_SECONDS`, then hands over: it publishes its successor's
job, claims on until the successor holds the wake flag (at most `HANDOVER_SECONDS`) and
drains what it has in flight, so a job never runs long, a worker shutdown is quick and no
write waits for the broker in between. A nudge announcing new writes (webhooks/wake.py)
makes it claim at once; it polls only as a fallback; out of work, it lingers
`A2A_WEBHOOK_PUMP_LINGER_SECONDS` for nudges before it exits. Without nudges (no Redis) it
claims on every turn.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ALL_COMPLETED, Future, wait
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from webhooks import heads, wake
from webhooks.delivery import (
    DeliveryClaim,
    delivery_claim_batch,
    delivery_record_many,
    relaxed_commits,
)
from webhooks.transport import PostRequest, TransportResult, submit

# While it may claim, a pump looks for new work at least this often, whatever it waits for
# (sends, nudges): heads stepped back at a busy endpoint come due again, and a nudge lost
# while the subscriber reconnects delays a write by this much at most. Writes committed
# while it holds the wake flag published no job and count on it.
POLL_SECONDS = 0.1
# Once a send finished, those finishing within this long are recorded with it.
GATHER_SECONDS = 0.002
# Claimed beyond the sends that just finished (see `pace`).
PROBE = 4
# A stopping pump leaves a timed wake-up for heads due within this long.
SOON_SECONDS = 1.0
# A pump past its deadline claims on for at most this long while its successor starts.
HANDOVER_SECONDS = 1.0


@dataclass
class PumpRun:
    claims: int = 0  # claim transactions
    claimed: int = 0
    recorded: int = 0
    delivered: int = 0


class _Signals:
    """What a pump waits for: `activity` is set when one of its sends finishes or a nudge
    arrives (webhooks/wake.py), `nudged` only by a nudge."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex  # this pump's value of the wake flag
        self.activity = threading.Event()
        self.nudged = threading.Event()

    def nudge(self, holder: bytes) -> None:
        if holder.decode(errors="replace") == self.token:
            self.nudged.set()
            self.activity.set()


def run_pump() -> PumpRun:
    signals = _Signals()
    linger = settings.A2A_WEBHOOK_PUMP_LINGER_SECONDS if wake.listen(signals.nudge) else 0.0
    try:
        with relaxed_commits():
            return _pump(signals, linger=linger)
    finally:
        wake.unlisten(signals.nudge)


def _pump(signals: _Signals, *, linger: float) -> PumpRun:
    run = PumpRun()
    activity, nudged, token = signals.activity, signals.nudged, signals.token
    window = settings.A2A_WEBHOOK_PUMP_WINDOW
    deadline = time.monotonic() + settings.A2A_WEBHOOK_PUMP_SECONDS
    in_flight: dict[Future[TransportResult], DeliveryClaim] = {}

    # How many to claim next: a full window when nothing is in flight; else about as many as
    # just finished (what their endpoints can take again) plus a few, so a saturated endpoint's
    # due configs are not all locked and stepped back on every turn.
    pace = window

    # Whether the next turn claims. With nudges, a pump claims after a nudge, when a record
    # left a successor due or its last claim may have left due heads behind (it read as many
    # as it could take), and at least every POLL_SECONDS; not after every record, which at a
    # low rate found nothing each time (a transaction per event, measured). Without nudges it
    # claims every turn.
    claim_now = True
    more_due = False
    last_claim = 0.0

    def claim_more() -> int:
        nonlocal more_due, last_claim
        nudged.clear()  # a nudge from here on may be for writes this claim misses
        room = min(window - len(in_flight), pace if in_flight else window)
        if room <= 0:
            more_due = True  # asked to claim with a full window: claim after the next record
            return 0
        last_claim = time.monotonic()
        run.claims += 1
        batch = delivery_claim_batch(limit=room)
        claims = batch.claims
        more_due = not batch.exhausted
        requests = [PostRequest(claim.url, claim.body, claim.headers) for claim in claims]
        sends = submit(requests, settings.A2A_WEBHOOK_TIMEOUT_SECONDS)
        for claim, future in zip(claims, sends, strict=True):
            future.add_done_callback(lambda _: activity.set())
            in_flight[future] = claim
        run.claimed += len(claims)
        return len(claims)

    claiming = True
    # When this pump last set the wake flag: refreshed well within its TTL, not on every turn
    # (a Redis round trip each, measured).
    held_at: float | None = None
    refresh_after = settings.A2A_WEBHOOK_WAKE_TTL_SECONDS / 3
    idle_since: float | None = None
    # At its deadline a busy pump asks for a successor and claims on until the successor holds
    # the flag (or HANDOVER_SECONDS pass), so writes never wait for the broker round trip in
    # between (~80 ms a handover, measured: the latency run's slow events every 2 s).
    handover_at: float | None = None
    try:
        while True:
            now = time.monotonic()
            if claiming and now >= deadline and (in_flight or idle_since is None):
                if handover_at is None:
                    handover_at = now
                    wake.wake(force=True)  # the successor's job
                elif now - handover_at >= HANDOVER_SECONDS or not wake.holds(token):
                    claiming = False  # the successor claims from here; this one drains
                    wake.release(token)
            if claiming:
                if handover_at is None and (held_at is None or now - held_at >= refresh_after):
                    wake.hold(token)
                    held_at = now
                if claim_now or not linger or nudged.is_set() or now - last_claim >= POLL_SECONDS:
                    claim_more()
                claim_now = False
                if not in_flight:
                    # Nothing to do: stay a moment with the flag held, so the next writes
                    # nudge this pump instead of publishing a job each.
                    idle_since = idle_since or now
                    left = min(idle_since + linger, deadline) - now
                    if left > 0:
                        poll_in = POLL_SECONDS - (now - last_claim)
                        nudged.wait(max(0.0, min(poll_in, left)))
                        claim_now = poll_in <= left  # the poll is due (a nudge says so itself)
                        continue
                    wake.release(token)
                    held_at = None
                    if not claim_more():  # what was committed while the flag was held
                        break
                idle_since = None
            if not in_flight:
                break
            # Cleared before looking: a send finishing or a nudge arriving later sets it again.
            activity.clear()
            if not any(future.done() for future in in_flight):
                if not (claiming and nudged.is_set()):
                    activity.wait(POLL_SECONDS if claiming else None)
                if not any(future.done() for future in in_flight):
                    if not nudged.is_set():
                        pace = PROBE  # the poll found nothing finished: probe
                    claim_now = True
                    continue
            # Sends to a healthy receiver finish within moments of each other: take them in
            # one record (and so one claim) instead of a transaction each.
            done, _ = wait(in_flight, timeout=GATHER_SECONDS, return_when=ALL_COMPLETED)
            outcomes = delivery_record_many([(in_flight.pop(f), f.result()) for f in done])
            run.recorded += len(outcomes)
            pace = len(outcomes) + PROBE
            claim_now = more_due or any(o.next_due for o in outcomes)
            finished = [o for o in outcomes if o.state in ("delivered", "dead")]
            run.delivered += sum(1 for o in finished if o.state == "delivered")
            if finished and not claiming:
                wake.wake()  # their configs' next deliveries are due; this pump claims no more
    finally:
        if claiming:
            wake.release(token)
    if claiming:
        _wake_for_what_is_due_soon()
    return run


def _wake_for_what_is_due_soon() -> None:
    """A pump that stops leaves a timed wake-up for heads due within a second (those it
    stepped back at a saturated endpoint, retries due shortly), rather than the sweeper's."""
    soon = heads.next_due_within(SOON_SECONDS)
    if soon is not None:
        wake.wake(countdown=max(0.0, (soon - timezone.now()).total_seconds()))
