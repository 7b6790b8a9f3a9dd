"""Run one executor dispatch: claim it, run the executor under a renewed lease, release it."""

from __future__ import annotations

import contextlib
import logging
import threading

from django.conf import settings
from django.db import close_old_connections

from tasks.dispatch import dispatch_claim, dispatch_finish, dispatch_renew
from tasks.errors import TaskTerminal
from tasks.executors import get_executor
from tasks.executors.base import ExecutorContext, RunAgain
from tasks.models import Task
from tasks.state_machine import IllegalTransition
from tasks.states import TaskState

logger = logging.getLogger(__name__)


class _LeaseKeeper:
    """Renews the dispatch lease every third of its length while the executor runs."""

    def __init__(self, dispatch_id: int, worker: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(dispatch_id, worker), daemon=True, name="lease-keeper"
        )

    def _loop(self, dispatch_id: int, worker: str) -> None:
        interval = max(settings.A2A_DISPATCH_LEASE_SECONDS / 3, 0.5)
        try:
            while not self._stop.wait(interval):
                if not dispatch_renew(dispatch_id=dispatch_id, worker=worker):
                    return
        finally:
            close_old_connections()

    def __enter__(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_dispatch(*, dispatch_id: int, worker: str) -> str:
    """Returns what happened: skipped, done, again, stopped or failed (for logs and tests)."""
    claim = dispatch_claim(dispatch_id=dispatch_id, worker=worker)
    if claim is None:
        logger.info("dispatch not claimable; nothing to do", extra={"dispatch_id": dispatch_id})
        return "skipped"
    task = Task.objects.select_related("agent").get(pk=claim.task_id)
    executor = get_executor(task.agent.executor)
    ctx = ExecutorContext(task_id=claim.task_id, progress=dict(claim.progress))
    extra = {"task_id": claim.task_id, "dispatch_id": dispatch_id}
    if executor is None:
        logger.error("agent has no built-in executor", extra=extra)
        dispatch_finish(dispatch_id=dispatch_id, worker=worker)
        return "skipped"
    try:
        with _LeaseKeeper(dispatch_id, worker):
            outcome = executor(ctx)
    except Exception as exc:
        if isinstance(exc, TaskTerminal | IllegalTransition) and getattr(exc, "terminal", True):
            # Canceled (or otherwise finished) under our feet: a normal stop, not an error.
            logger.info("task finished while the executor ran; stopping", extra=extra)
            dispatch_finish(dispatch_id=dispatch_id, worker=worker, progress=ctx.progress)
            return "stopped"
        # Anything else, an illegal move included, is an executor bug: fail the task now
        # rather than leave the claim to lapse and the sweeper to retry the same bug.
        logger.exception("executor crashed; failing the task", extra=extra)
        from tasks.services import task_transition

        with contextlib.suppress(TaskTerminal, IllegalTransition):
            task_transition(
                task_id=claim.task_id, to_state=TaskState.FAILED, message="executor error"
            )
        dispatch_finish(dispatch_id=dispatch_id, worker=worker, progress=ctx.progress)
        return "failed"
    if isinstance(outcome, RunAgain):
        dispatch_finish(
            dispatch_id=dispatch_id,
            worker=worker,
            progress=ctx.progress,
            run_again_after=outcome.after_seconds,
        )
        return "again"
    dispatch_finish(dispatch_id=dispatch_id, worker=worker, progress=ctx.progress)
    return "done"
