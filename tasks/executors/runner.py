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
import functools
import logging

from a2a_platform.lib import doorbell
from a2a_platform.lib.reconnect import database_unreachable, fresh_connection, with_reconnect
from tasks.dispatch import (
    DispatchClaim,
    dispatch_claim,
    dispatch_claim_due,
    dispatch_finish,
    ring_for_due_dispatches,
)
from tasks.errors import TaskTerminal
from tasks.executors import get_executor, leases
from tasks.executors.base import ExecutorContext, RunAgain
from tasks.job_names import RUN_DUE_DISPATCHES_JOB
from tasks.state_machine import IllegalTransition
from tasks.states import TaskState

logger = logging.getLogger(__name__)

# A run the database interrupted runs again this soon (the dispatch row keeps the ETA).
RERUN_AFTER_SECONDS = 1.0


# How many dispatches one run_due job runs before it hands over to a job of its own (so the
# jobs queued behind it get their turn).
DUE_BATCH = 100
# In a backlog a job claims up to this many due dispatches in one transaction, then runs them
# in turn: one claim statement and one commit per batch instead of per task. Each claim's
# lease runs from the claim; a batch of quick runs ends well within it.
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
    return _run_claimed(claim, worker)


def run_due(*, worker: str, limit: int = DUE_BATCH) -> int:
    """Run the quick executors' due dispatches one after another; returns how many.

    The doorbell is cleared first, so a dispatch committed from then on rings for a job of
    its own. The first claim takes one dispatch; finding more after it means a backlog: from
    then on the job claims up to CLAIM_BATCH at a time and each batch it finds rings, so one
    more job waits on the queue for a free worker thread to join in, and past `limit` the
    rest is left to it."""
    doorbell.clear(RUN_DUE_DISPATCHES_JOB)
    ran = 0
    while ran < limit:
        batch = min(CLAIM_BATCH, limit - ran) if ran else 1
        claims = with_reconnect(
            functools.partial(dispatch_claim_due, worker=worker, limit=batch),
            what="dispatch claim",
            extra={},
        )
        if not claims:
            break
        if ran:
            ring_for_due_dispatches()
        for claim in claims:
            _run_claimed(claim, worker)
        ran += len(claims)
    return ran


def _run_claimed(claim: DispatchClaim, worker: str) -> str:
    dispatch_id = claim.dispatch_id
    extra = {"dispatch_id": dispatch_id, "task_id": claim.task_id}
    ctx = ExecutorContext(
        task_id=claim.task_id,
        progress=dict(claim.progress),
        user_parts=claim.user_parts,
        claimed_task=claim.task,
    )

    def release(**kwargs) -> None:
        with_reconnect(
            lambda: dispatch_finish(dispatch_id=dispatch_id, worker=worker, **kwargs),
            what="dispatch release",
            extra=extra,
        )

    try:
        executor = get_executor(claim.executor)
        if executor is None:
            logger.error("agent has no built-in executor", extra=extra)
            release()
            return "skipped"
        with leases.keeper().held(dispatch_id, worker):
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
    if isinstance(outcome, RunAgain):
        release(progress=ctx.progress, run_again_after=outcome.after_seconds)
        return "again"
    if ctx.finished:
        # The run's last verb committed a terminal state and, in that transaction, closed
        # this dispatch: a release would lock the task to find no claim (one transaction
        # and a WAL flush per task for nothing).
        return "done"
    release(progress=ctx.progress)
    return "done"


def _fail(task_id: str) -> None:
    from tasks.services import task_transition

    # Finished meanwhile (or failed by a try whose commit went unacknowledged): nothing to do.
    with contextlib.suppress(TaskTerminal, IllegalTransition):
        task_transition(task_id=task_id, to_state=TaskState.FAILED, message="executor error")
