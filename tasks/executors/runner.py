"""Run one executor dispatch: claim it, run the executor under a renewed lease, release it.

A database outage during a run (a PostgreSQL restart) is not an executor bug: the task is
not failed. The run stops, and its dispatch is released on a fresh connection to run again
in `RERUN_AFTER_SECONDS`, with the progress it made, so the task goes on within seconds of
the database coming back instead of after the sweeper's lease and unclaimed delays. The
built-in executors resume rather than replay: a step whose events are already in the task's
history is skipped (tasks/executors/echo.py, scripted.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
import uuid

from django.conf import settings
from django.db import transaction

from a2a_platform.lib import doorbell, tracing
from a2a_platform.lib.reconnect import database_unreachable, fresh_connection, with_reconnect
from agents.executor_spec import is_hosted
from tasks.dispatch import (
    DUE_HELPER_BELL,
    DispatchClaim,
    dispatch_claim,
    dispatch_claim_due,
    dispatch_finish,
    ring_for_a_helper,
    ring_for_due_dispatches,
)
from tasks.errors import TaskTerminal
from tasks.executors import get_executor, leases
from tasks.executors.base import ExecutorContext, RunAgain, write_buffered_answers
from tasks.hooks import hooks_together
from tasks.job_names import RUN_DUE_DISPATCHES_JOB
from tasks.selectors import task_trace
from tasks.state_machine import IllegalTransition
from tasks.states import TaskState

logger = logging.getLogger(__name__)

# A run the database interrupted runs again this soon (the dispatch row keeps the ETA).
RERUN_AFTER_SECONDS = 1.0


# A job claims up to this many due dispatches in one statement and runs a batch of more than
# one in one transaction (`_run_together`): one claim and one commit per batch, not per task.
CLAIM_BATCH = 10


def run_dispatch(*, dispatch_id: int, worker: str) -> str:
    """Returns what happened: skipped, done, again, stopped, interrupted or failed (for logs
    and tests)."""
    extra = {"dispatch_id": dispatch_id}
    claim = with_reconnect(
        lambda: dispatch_claim(dispatch_id=dispatch_id, worker=worker),
        what="dispatch claim",
        extra=extra,
    )
    if claim is None:
        logger.info("dispatch not claimable; nothing to do", extra=extra)
        return "skipped"
    if is_hosted(claim.executor):
        # A hosted dispatch announced as a built-in's (published before hosts took them):
        # handed back, due now, and announced again for a host (tasks/executors/host.py).
        release_claim(claim, worker, progress=claim.progress, run_again_after=0)
        return "handed to a host"
    return _run_claimed(claim, worker)


def run_due(
    *,
    worker: str,
    limit: int | None = None,
    linger: float = 0.0,
    seconds: float | None = None,
    helper: bool = False,
) -> int:
    """Run the quick executors' due dispatches one after another; returns how many.

    A drain watches the doorbell while it claims (a2a_platform/lib/doorbell.py): a quick
    dispatch committed meanwhile rings for it instead of publishing a job. Each claim takes up
    to CLAIM_BATCH due dispatches, and a batch of more than one runs in one transaction
    (`_run_together`). Out of work, the drain waits up to `linger` seconds for a ring and
    claims again on one, so a steady stream of sends is run by one job, not a job per burst.
    After `seconds` (default: A2A_DISPATCH_DRAIN_SECONDS), or `limit` dispatches, or a
    linger with no ring, it releases the bell and claims once more, for what was committed
    while it watched it; when it stopped with work left (a full batch), it rings for a fresh
    drain instead.

    A full batch means a backlog: it asks for a helper (`helper=True`,
    tasks.dispatch.ring_for_a_helper), which drains beside it on another worker thread or
    process, without the bell and without lingering, and rings the bell if it stops with
    work left."""
    if seconds is None:
        seconds = settings.A2A_DISPATCH_DRAIN_SECONDS
    deadline = time.monotonic() + seconds
    if helper:
        doorbell.release(DUE_HELPER_BELL)  # the next full batch may ask for another
        ran, more = _drain(worker, limit, deadline)
    else:
        drain = BellWatch(RUN_DUE_DISPATCHES_JOB, linger)
        try:
            ran, more = _drain(worker, limit, deadline, drain)
        finally:
            drain.stop()
        if not more:
            # Rings while the drain watched the bell published no job and count on this claim.
            more = (last := _claim_and_run(worker, CLAIM_BATCH)) == CLAIM_BATCH
            ran += last
    if more:
        ring_for_due_dispatches()  # stopped with work left: a fresh drain for it
    return ran


class BellWatch:
    """The bell a drain watches (with its own token, refreshed within the bell's TTL) and the
    rings it waits for: the quick executors' drain here, the hosted runs' in host.py."""

    def __init__(self, bell: str, linger: float) -> None:
        self.bell = bell
        self.token = uuid.uuid4().hex
        self.rung = threading.Event()
        self.watched_at: float | None = None
        self.linger = linger if linger > 0 and doorbell.listen(self.hear) else 0.0

    def hear(self, token: bytes) -> None:
        if token == self.token.encode():
            self.rung.set()

    def watch(self) -> None:
        """Before each claim: the bell names this drain. `rung` is cleared, so a ring for
        writes this claim misses makes the drain claim again."""
        self._refresh()
        self.rung.clear()

    def wait(self, deadline: float) -> bool:
        """Out of work: True when a ring came within the linger (and before `deadline`). A
        linger longer than the bell's TTL keeps watching the bell meanwhile."""
        end = min(time.monotonic() + self.linger, deadline)
        while (left := end - time.monotonic()) > 0:
            if self.rung.wait(min(left, doorbell.RING_SECONDS / 3)):
                return True
            self._refresh()
        return False

    def _refresh(self) -> None:
        """Watch the bell, refreshed at a third of its TTL (not on every claim: a Redis round
        trip each); a drain that died stops watching it within the TTL."""
        now = time.monotonic()
        if self.watched_at is None or now - self.watched_at >= doorbell.RING_SECONDS / 3:
            doorbell.watch(self.bell, self.token)
            self.watched_at = now

    def stop(self) -> None:
        doorbell.unlisten(self.hear)
        doorbell.release(self.bell, self.token)


def _drain(
    worker: str, limit: int | None, deadline: float, drain: BellWatch | None = None
) -> tuple[int, bool]:
    """Claim and run batches until out of work (and, watching the bell, no ring within the
    linger), `deadline` or `limit`; returns how many ran and whether the last batch was full
    (work is likely left)."""
    ran = 0
    while True:
        if drain is not None:
            drain.watch()
        batch = CLAIM_BATCH if limit is None else min(CLAIM_BATCH, limit - ran)
        ran += (count := _claim_and_run(worker, batch))
        full = count == batch
        if (limit is not None and ran >= limit) or time.monotonic() >= deadline:
            return ran, full
        if full:
            ring_for_a_helper()
        elif drain is None or not drain.wait(deadline):
            return ran, False


def _claim_and_run(worker: str, batch: int) -> int:
    """Claim up to `batch` due dispatches and run them; how many."""
    claims = with_reconnect(
        functools.partial(dispatch_claim_due, worker=worker, limit=batch),
        what="dispatch claim",
        extra={},
    )
    if len(claims) == 1:
        _run_claimed(claims[0], worker)
    elif claims:
        _run_together(claims, worker)
    return len(claims)


def _run_together(claims: list[DispatchClaim], worker: str) -> None:
    """Run a batch of quick claims in one transaction: each run's answer is buffered and the
    batch's answers are written together at its end (one statement: services.task_answers),
    and commit together (one BEGIN, one COMMIT and one WAL flush for the batch, not one per
    task; one outbox statement for all their events, tasks.hooks.hooks_together), then each
    is settled as `_run_claimed` settles it. The batch runs in task id order, so its task rows
    are locked in the order a rebind locks them (webhooks/rebinds/operations.py).

    If any run raises (a task canceled meanwhile, a deadlock, the database gone), the
    transaction is rolled back, nothing of the batch is written, and each claim is run
    again on its own, the locked way (`task=None`: the attempt moved the claim's row on in
    memory), where its error is handled as a lone run's is."""
    ordered = sorted(claims, key=lambda claim: claim.task_id)  # a UUID's text sorts as it does
    runs: list[tuple[DispatchClaim, ExecutorContext, RunAgain | None]] = []
    try:
        with contextlib.ExitStack() as renewing:
            for claim in ordered:
                renewing.enter_context(leases.keeper().renewing(claim.dispatch_id, worker))
            # The batch's event hooks (its outbox rows) run once, for all of it, before the
            # commit: one outbox statement instead of one per answer.
            with transaction.atomic(), hooks_together():
                for claim in ordered:
                    executor = get_executor(claim.executor)
                    if executor is None:
                        raise LookupError(f"no built-in executor {claim.executor!r}")
                    ctx = _context(claim, batched=True)
                    with run_span(claim):
                        runs.append((claim, ctx, executor(ctx)))
                # The answers the runs buffered, written together (one statement).
                write_buffered_answers([ctx for _, ctx, _ in runs])
    except Exception:
        logger.info(
            "a batch of quick runs rolled back; running each on its own",
            extra={"dispatch_ids": [claim.dispatch_id for claim in ordered]},
            exc_info=True,
        )
        for claim in ordered:
            _run_claimed(dataclasses.replace(claim, task=None), worker)
        return
    for claim, ctx, outcome in runs:
        _settle(claim, ctx, outcome, worker)


def _context(claim: DispatchClaim, *, batched: bool = False) -> ExecutorContext:
    return ExecutorContext(
        task_id=claim.task_id,
        progress=dict(claim.progress),
        user_parts=claim.user_parts,
        claimed_task=claim.task,
        batched=batched,
    )


def run_span(claim: DispatchClaim, trace: tuple[str, str] | None = None):
    """The span of one executor run, in its task's trace (a2a_platform/lib/tracing.py). The
    task's trace context from `trace`, else the claim's task row, else (only when spans are
    exported) read."""
    if trace is None and claim.task is not None:
        trace = (claim.task.traceparent, claim.task.tracestate)
    if trace is None:
        trace = task_trace(claim.task_id) if tracing.exporting() else ("", "")
    attributes = {
        "a2a.task.id": str(claim.task_id),
        "a2a.dispatch.id": claim.dispatch_id,
        "a2a.executor": claim.executor,
    }
    return tracing.task_span("executor run", trace[0], trace[1], attributes)


def release_claim(claim: DispatchClaim, worker: str, **kwargs) -> None:
    """Release a claim (tasks.dispatch.dispatch_finish), riding out a database blip."""
    with_reconnect(
        lambda: dispatch_finish(dispatch_id=claim.dispatch_id, worker=worker, **kwargs),
        what="dispatch release",
        extra={"dispatch_id": claim.dispatch_id, "task_id": claim.task_id},
    )


def _run_claimed(claim: DispatchClaim, worker: str) -> str:
    dispatch_id = claim.dispatch_id
    extra = {"dispatch_id": dispatch_id, "task_id": claim.task_id}
    ctx = _context(claim)
    release = functools.partial(release_claim, claim, worker)
    try:
        executor = get_executor(claim.executor)
        if executor is None:
            logger.error("agent has no built-in executor", extra=extra)
            release()
            return "skipped"
        with leases.keeper().renewing(dispatch_id, worker), run_span(claim):
            outcome = executor(ctx)
    except Exception as exc:
        if database_unreachable(exc):
            # Whatever the executor committed before the outage stays; a resume skips it.
            logger.warning(
                "database unreachable during the run; running it again shortly", extra=extra
            )
            fresh_connection()
            release(progress=ctx.progress, run_again_after=RERUN_AFTER_SECONDS)
            return "interrupted"
        if isinstance(exc, TaskTerminal | IllegalTransition) and getattr(exc, "terminal", True):
            # Canceled (or otherwise finished) under our feet: a normal stop, not an error.
            logger.info("task finished while the executor ran; stopping", extra=extra)
            release(progress=ctx.progress)
            return "stopped"
        # Anything else, an illegal move included, is an executor bug: fail the task now
        # rather than leave the claim to lapse and the sweeper to retry the same bug.
        logger.exception("executor crashed; failing the task", extra=extra)
        with_reconnect(lambda: _fail(claim.task_id), what="fail the task", extra=extra)
        release(progress=ctx.progress)
        return "failed"
    return _settle(claim, ctx, outcome, worker)


def _settle(
    claim: DispatchClaim, ctx: ExecutorContext, outcome: RunAgain | None, worker: str
) -> str:
    """After a run that returned (and committed): its dispatch pending again at the ETA a
    RunAgain asks for, left as it is after a terminal answer, else released."""
    if isinstance(outcome, RunAgain):
        release_claim(claim, worker, progress=ctx.progress, run_again_after=outcome.after_seconds)
        return "again"
    if ctx.finished:
        # The run's last verb committed a terminal state and, in that transaction, closed
        # this dispatch: a release would lock the task to find no claim (one transaction
        # and a WAL flush per task for nothing).
        return "done"
    release_claim(claim, worker, progress=ctx.progress)
    return "done"


def _fail(task_id: str) -> None:
    from tasks.services import task_transition

    # Finished meanwhile (or failed by a try whose commit went unacknowledged): nothing to do.
    with contextlib.suppress(TaskTerminal, IllegalTransition):
        task_transition(task_id=task_id, to_state=TaskState.FAILED, message="executor error")
