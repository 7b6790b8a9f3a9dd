"""The delivery pump: claim due heads in batches, POST them concurrently, record as they land.

One pump runs inside one `webhooks.deliver` job. It keeps up to `A2A_WEBHOOK_PUMP_WINDOW`
sends in flight on the process's sender loop (webhooks/delivery/transport.py); whenever some finish
it records them in one transaction and, when that left a successor due or its last claim
could not take everything due, claims again, so a delivered head's successor goes next
without a broker round trip, and a hung receiver holds one window slot, never the batch.
Claims, records and order are webhooks/delivery/claim_record.py's; ringing for pumps is
webhooks/delivery/bell.py's.

A pump claims for `A2A_WEBHOOK_PUMP_SECONDS`, then hands over: it publishes its successor's
job, claims on until the successor watches the bell (at most `HANDOVER_SECONDS`) and
drains what it has in flight, so a job never runs long, a worker shutdown is quick and no
write waits for the broker in between. A ring announcing new writes (webhooks/delivery/bell.py)
makes it claim at once; it polls only as a fallback; out of work, it lingers
`A2A_WEBHOOK_PUMP_LINGER_SECONDS` for rings before it exits. Without rings heard (no Redis) it
claims on every turn.

The life of a delivery, module by module: webhooks/services.py writes it (the outbox hook,
through webhooks/delivery/outbox_store/) and webhooks/delivery/bell.py rings for a pump after the
commit; this pump claims it (webhooks/delivery/claim_record.py: the statements in outbox_store/,
each config's head time in webhooks/delivery/heads.py), sends it (webhooks/delivery/transport.py)
and records it (delivery.py again, deciding retries with webhooks/delivery/retry_policy.py).
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ALL_COMPLETED, Future, wait
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from a2a_platform.lib import tracing
from a2a_platform.lib.reconnect import with_reconnect
from webhooks.delivery import bell, heads
from webhooks.delivery.claim_record import (
    ENDED,
    DeliveryClaim,
    OutcomeState,
    delivery_claim_batch,
    delivery_record_many,
    relaxed_commits,
)
from webhooks.delivery.transport import PostRequest, TransportResult, submit

# While it may claim, a pump looks for new work at least this often, whatever it waits for
# (sends, rings): heads stepped back at a busy endpoint come due again, and a ring lost
# while the subscriber reconnects delays a write by this much at most. Writes committed
# while it watches the bell published no job and count on it.
POLL_SECONDS = 0.1
# Once a send finished, those finishing within this long are recorded with it.
GATHER_SECONDS = 0.002
# Claimed beyond the sends that just finished (see `pace`).
PROBE = 4
# A stopping pump leaves a timed ring for heads due within this long.
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
    """What a pump waits for: `activity` is set when one of its sends finishes or it hears a
    ring (webhooks/delivery/bell.py), `rung` only by a ring."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex  # the token this pump watches the bell with
        self.activity = threading.Event()
        self.rung = threading.Event()

    def hear(self, token: bytes) -> None:
        if token.decode(errors="replace") == self.token:
            self.rung.set()
            self.activity.set()


def run_pump() -> PumpRun:
    signals = _Signals()
    linger = settings.A2A_WEBHOOK_PUMP_LINGER_SECONDS if bell.listen(signals.hear) else 0.0
    try:
        with relaxed_commits():
            return _Pump(signals, linger=linger).pump()
    finally:
        bell.unlisten(signals.hear)


class _Pump:
    """One pump's loop: each turn hands over at the deadline, watches the bell, claims,
    lingers when out of work, waits for sends, and records what finished. The state kept
    between turns is the fields below."""

    def __init__(self, signals: _Signals, *, linger: float) -> None:
        self.signals = signals
        self.linger = linger
        self.run = PumpRun()
        self.window = settings.A2A_WEBHOOK_PUMP_WINDOW
        self.deadline = time.monotonic() + settings.A2A_WEBHOOK_PUMP_SECONDS
        self.in_flight: dict[Future[TransportResult], DeliveryClaim] = {}
        self.spans: dict[Future[TransportResult], tracing.Span] = {}  # when exporting
        # How many to claim next: a full window when nothing is in flight; else about as many
        # as just finished (what their endpoints can take again) plus a few, so a saturated
        # endpoint's due configs are not all locked and stepped back on every turn.
        self.pace = self.window
        # Whether the next turn claims. With rings heard, a pump claims after a ring, when a
        # record left a successor due or its last claim may have left due heads behind (it
        # read as many as it could take), and at least every POLL_SECONDS; not after every
        # record, which at a low rate found nothing each time (a transaction per event,
        # measured). Without rings heard it claims every turn.
        self.claim_now = True
        self.more_due = False
        self.last_claim = 0.0
        self.claiming = True
        # When this pump last set the bell: refreshed well within its TTL, not on every
        # turn (a Redis round trip each, measured).
        self.watched_at: float | None = None
        self.refresh_after = settings.A2A_WEBHOOK_WAKE_TTL_SECONDS / 3
        self.idle_since: float | None = None
        # At its deadline a busy pump asks for a successor and claims on until the successor
        # watches the bell (or HANDOVER_SECONDS pass), so writes never wait for the broker round
        # trip in between (~80 ms a handover, measured: the latency run's slow events every
        # 2 s).
        self.handover_at: float | None = None

    def pump(self) -> PumpRun:
        """Turn until nothing is in flight and nothing is left to claim."""
        try:
            while self.turn():
                pass
        finally:
            if self.claiming:
                bell.release(self.signals.token)
        if self.claiming:
            _ring_for_what_is_due_soon()
        return self.run

    def turn(self) -> bool:
        """One turn of the loop; False when the pump is done."""
        now = time.monotonic()
        if self.claiming and now >= self.deadline and (self.in_flight or self.idle_since is None):
            self.hand_over(now)
        if self.claiming:
            self.watch_bell(now)
            if self.should_claim(now):
                self.claim()
            self.claim_now = False
            if not self.in_flight:
                if self.linger_for_rings(now):
                    return True
                if not self.release_and_claim():
                    return False
            self.idle_since = None
        if not self.in_flight:
            return False
        if self.wait_for_activity():
            self.record_finished()
        return True

    def hand_over(self, now: float) -> None:
        """Past the deadline, publish the successor's job, then stop claiming once it watches
        the bell (or HANDOVER_SECONDS passed): writes in between never wait for the broker."""
        if self.handover_at is None:
            self.handover_at = now
            bell.ring(force=True)  # the successor's job
        elif now - self.handover_at >= HANDOVER_SECONDS or not bell.watching(self.signals.token):
            self.claiming = False  # the successor claims from here; this one drains
            bell.release(self.signals.token)

    def watch_bell(self, now: float) -> None:
        """Keep the bell naming this pump, refreshed within its TTL: writes committed while it
        claims ring for it instead of publishing a job each, and the bell never lapses mid-run."""
        if self.handover_at is None and (
            self.watched_at is None or now - self.watched_at >= self.refresh_after
        ):
            bell.watch(self.signals.token)
            self.watched_at = now

    def should_claim(self, now: float) -> bool:
        """Whether this turn claims: at most a poll apart, so a ring lost while the subscriber
        reconnects, or a head stepped back at a busy endpoint, waits one poll at most."""
        return (
            self.claim_now
            or not self.linger
            or self.signals.rung.is_set()
            or now - self.last_claim >= POLL_SECONDS
        )

    def claim(self) -> int:
        """Claim what the window has room for and start the sends; `rung` is cleared first, so
        a ring for writes this claim misses makes a later turn claim."""
        self.signals.rung.clear()
        room = min(self.window - len(self.in_flight), self.pace if self.in_flight else self.window)
        if room <= 0:
            self.more_due = True  # asked to claim with a full window: claim after the next record
            return 0
        self.last_claim = time.monotonic()
        self.run.claims += 1
        # A database blip is ridden out on a fresh connection (bounded, then raised: the job
        # fails and the leases and the sweeper take over).
        batch = with_reconnect(lambda: delivery_claim_batch(limit=room), what="delivery claim")
        self.more_due = not batch.exhausted
        spans = [_attempt_span(claim) for claim in batch.claims]
        requests = [
            PostRequest(
                claim.url,
                claim.body,
                tracing.headers_for_span(claim.headers, span),
                tracing.span_context_of(span),
            )
            for claim, span in zip(batch.claims, spans, strict=True)
        ]
        sends = submit(requests, settings.A2A_WEBHOOK_TIMEOUT_SECONDS)
        activity = self.signals.activity
        for claim, future, span in zip(batch.claims, sends, spans, strict=True):
            future.add_done_callback(lambda _: activity.set())
            self.in_flight[future] = claim
            if span.get_span_context().is_valid:
                self.spans[future] = span
        self.run.claimed += len(batch.claims)
        return len(batch.claims)

    def linger_for_rings(self, now: float) -> bool:
        """Out of work, wait a moment still watching the bell (until the linger or the deadline
        ends; True while it does), so the next writes ring for this pump instead of publishing a
        job each."""
        self.idle_since = self.idle_since or now
        left = min(self.idle_since + self.linger, self.deadline) - now
        if left <= 0:
            return False
        poll_in = POLL_SECONDS - (now - self.last_claim)
        self.signals.rung.wait(max(0.0, min(poll_in, left)))
        self.claim_now = poll_in <= left  # the poll is due (a ring says so itself)
        return True

    def release_and_claim(self) -> int:
        """Release the bell, then claim once more: writes committed while this pump watched it
        published no job and count on this claim."""
        bell.release(self.signals.token)
        self.watched_at = None
        return self.claim()

    def wait_for_activity(self) -> bool:
        """Wait until a send finishes or a ring is heard (a poll at most while claiming); True
        when a send finished. `activity` is cleared before looking, so a send finishing in
        between sets it again and is not slept through."""
        activity, rung = self.signals.activity, self.signals.rung
        activity.clear()
        if any(future.done() for future in self.in_flight):
            return True
        if not (self.claiming and rung.is_set()):
            activity.wait(POLL_SECONDS if self.claiming else None)
        if any(future.done() for future in self.in_flight):
            return True
        if not rung.is_set():
            self.pace = PROBE  # the poll found nothing finished: probe
        self.claim_now = True
        return False

    def record_finished(self) -> None:
        """Record the finished sends, with those finishing within GATHER_SECONDS, in one
        transaction, and claim next when that left a successor due: a delivered head's
        successor goes without a broker round trip, and once this pump claims no more, a
        ring hands the successors to another pump."""
        # Sends to a healthy receiver finish within moments of each other: take them in one
        # record (and so one claim) instead of a transaction each.
        done, _ = wait(self.in_flight, timeout=GATHER_SECONDS, return_when=ALL_COMPLETED)
        finished = [(self.in_flight.pop(f), f.result()) for f in done]
        for future in done:
            span = self.spans.pop(future, None)
            if span is not None:
                result = future.result()
                tracing.end_http_span(span, result.status, result.error_class, ok=result.ok)
        # Sent, and so owed a record: a record that meets a dropped connection is tried again
        # on a fresh one (up to reconnect.RETRY_BUDGET_SECONDS), so a database restart costs
        # these deliveries seconds, not their lease. A record that did commit before its
        # connection dropped finds the attempt already recorded (`OutcomeState.STALE`): never twice.
        outcomes = with_reconnect(
            lambda: delivery_record_many(finished),
            what="delivery record",
            extra={"deliveries": len(finished)},
        )
        self.run.recorded += len(outcomes)
        self.pace = len(outcomes) + PROBE
        self.claim_now = self.more_due or any(o.next_due for o in outcomes)
        ended = [o for o in outcomes if o.state in ENDED]
        self.run.delivered += sum(1 for o in ended if o.state == OutcomeState.DELIVERED)
        if ended and not self.claiming:
            bell.ring()  # their configs' next deliveries are due; this pump claims no more


def _attempt_span(claim: DeliveryClaim) -> tracing.Span:
    """The span of one delivery attempt, in its task's trace (INVALID_SPAN unless spans are
    exported); the delivered `traceparent` names it (or the aiohttp client span under it)."""
    return tracing.start_task_span(
        "webhook delivery",
        claim.traceparent,
        claim.tracestate,
        {
            "http.request.method": "POST",
            "a2a.delivery.id": claim.delivery_pk,
            "a2a.delivery.attempt": claim.attempt_number,
            "a2a.binding_version": claim.binding_version,
            "a2a.event.kind": str(claim.kind),
            "a2a.task.id": claim.headers.get("X-A2A-Task-Id", ""),
        },
        kind=tracing.SpanKind.PRODUCER,
    )


def _ring_for_what_is_due_soon() -> None:
    """A pump that stops leaves a timed ring for heads due within a second (those it
    stepped back at a saturated endpoint, retries due shortly), rather than the sweeper's."""
    soon = heads.next_due_within(SOON_SECONDS)
    if soon is not None:
        bell.ring(countdown=max(0.0, (soon - timezone.now()).total_seconds()))
