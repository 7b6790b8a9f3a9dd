"""The dispatch sweeper (beat job `tasks.sweep_dispatches`): stranded dispatches re-enqueued at
row level (tasks/dispatch.py), and the tasks whose executor is lost failed visibly through the
lifecycle service. Above both dispatch.py and services.py, so neither imports the other back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tasks.dispatch import dispatch_sweep_stranded
from tasks.services import task_transition
from tasks.states import TaskState

logger = logging.getLogger(__name__)

EXECUTOR_LOST_MESSAGE = "executor lost: no executor finished this task after {tries} tries"


@dataclass(frozen=True)
class SweepResult:
    re_enqueued: int
    failed_tasks: int


def dispatch_sweep(*, now=None, batch: int = 500) -> SweepResult:
    """Re-enqueue stranded dispatches; fail the task when the tries are used up.

    Side effects: executor jobs enqueued after commit (dispatch_sweep_stranded), then one
    task_transition to FAILED per lost dispatch, each its own transaction (a task that
    finished meanwhile is left as it is).
    """
    swept = dispatch_sweep_stranded(now=now, batch=batch)
    failed = 0
    for task_id, tries in swept.lost:
        try:
            task_transition(
                task_id=task_id,
                to_state=TaskState.FAILED,
                message=EXECUTOR_LOST_MESSAGE.format(tries=tries),
            )
            failed += 1
            logger.error("executor lost; task failed", extra={"task_id": str(task_id)})
        except Exception:
            logger.info("executor lost on a finished task", extra={"task_id": str(task_id)})
    return SweepResult(swept.re_enqueued, failed)
