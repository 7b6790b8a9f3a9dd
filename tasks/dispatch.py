"""Durable executor dispatch: a row written with the task change, claimed with a lease.

The dispatch row is the truth; the Celery message that announces it is only a hint. The
sweeper (`tasks.sweeper.dispatch_sweep`, on beat) re-enqueues a dispatch nobody claimed in time
or whose lease lapsed, and after A2A_DISPATCH_MAX_TRIES enqueues fails the task visibly, so a
task never sits in SUBMITTED or WORKING forever because a message or a worker was lost. This
module works at row level only (open, claim, renew, finish, close, sweep the rows): it calls no
lifecycle service, so tasks/services.py may use it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from a2a_platform.lib import doorbell
from a2a_platform.lib.on_commit import enqueue_on_commit, send_job
from agents.executor_spec import is_hosted
from agents.models import Agent, Executor
from tasks.errors import NotExternalExecutor
from tasks.job_names import RUN_DUE_DISPATCHES_JOB, RUN_DUE_HOSTED_JOB, RUN_EXECUTOR_JOB
from tasks.models import ACTIVE_DISPATCH_STATES, DispatchState, ExecutorDispatch, Task
from tasks.task_store import get_task_store
from tasks.task_store.base import ReleaseOutcome

logger = logging.getLogger(__name__)
# A line per claim, on the logger of tasks/services.py's per-task lines (A2A_TASK_LOG_LEVEL).
lifecycle_log = logging.getLogger("tasks.lifecycle")


# Built-in executors whose run is short and never waits: a new dispatch of theirs rings the
# doorbell instead of publishing a job of its own, and one RUN_DUE_DISPATCHES_JOB runs every
# due one in turn (`dispatch_claim_due`). A job's publish and its consumption are then paid
# once per batch, not once per task (docs/decisions.md, "The doorbell"). A run that asks to
# run again later, a release that finds new input, and the sweeper's re-enqueues still
# publish the dispatch's own job.
QUICK_EXECUTORS: tuple[str, ...] = (Executor.ECHO,)
# The bell of the helper jobs a backlog asks for (`ring_for_a_helper`).
DUE_HELPER_BELL = f"{RUN_DUE_DISPATCHES_JOB}:helper"


def _uses_celery(task: Task) -> bool:
    return task.agent.executor != Executor.EXTERNAL


def ring_for_due_dispatches() -> None:
    """Publish a RUN_DUE_DISPATCHES_JOB unless one is on its way or a drain watches the bell
    (it hears the ring instead: a2a_platform/lib/doorbell.py). A publish the broker refused
    gives the bell back: no job carries it, so the next ring must try."""
    if doorbell.ring(RUN_DUE_DISPATCHES_JOB) and not send_job(RUN_DUE_DISPATCHES_JOB, []):
        doorbell.release(RUN_DUE_DISPATCHES_JOB)


def ring_for_hosted_runs() -> None:
    """Publish a RUN_DUE_HOSTED_JOB unless one is on its way or a worker's host watches the
    bell (it hears the ring and claims): new hosted dispatches cost a ring, not a job each."""
    if doorbell.ring(RUN_DUE_HOSTED_JOB) and not send_job(RUN_DUE_HOSTED_JOB, []):
        doorbell.release(RUN_DUE_HOSTED_JOB)


def ring_for_a_helper() -> None:
    """A drain claimed a full batch (a backlog): publish a helper job, which drains beside it
    without lingering, unless one is on its way (a bell of its own, given back as the helper
    starts)."""
    if doorbell.ring(DUE_HELPER_BELL) and not send_job(
        RUN_DUE_DISPATCHES_JOB, [], kwargs={"helper": True}
    ):
        doorbell.release(DUE_HELPER_BELL)


def _announce_run(dispatch_id: int, executor: str, countdown: float | None = None) -> None:
    """Publish the dispatch's executor job after commit: a hosted executor's goes to the
    worker's host (tasks/executors/host.py), which claims it only when it has a slot."""
    kwargs = {"hosted": True} if is_hosted(executor) else None
    enqueue_on_commit(RUN_EXECUTOR_JOB, [dispatch_id], countdown=countdown, kwargs=kwargs)


def _announce(dispatch: ExecutorDispatch, countdown: float | None = None) -> None:
    """Count one enqueue and, for Celery executors, publish the job after commit."""
    dispatch.enqueues += 1
    if _uses_celery(dispatch.task):
        _announce_run(dispatch.pk, dispatch.task.agent.executor, countdown)


def dispatch_open(task: Task, *, progress: dict | None = None) -> ExecutorDispatch | None:
    """Inside a lifecycle transaction: ask for an executor run unless one is active.

    The new dispatch carries over the progress of the task's previous one (multi-turn
    executors continue where they stopped).
    """
    if task.dispatches.filter(state__in=ACTIVE_DISPATCH_STATES).exists():
        return None
    if progress is None:
        last = task.dispatches.order_by("-id").only("progress").first()
        progress = last.progress if last else {}
    dispatch = ExecutorDispatch.objects.create(
        task=task, not_before=timezone.now(), progress=progress, enqueues=1
    )
    dispatch_announce_new([dispatch])
    return dispatch


def dispatch_announce_new(dispatches: Sequence[ExecutorDispatch]) -> None:
    """After the write of new tasks with their first dispatches (each counted as enqueued
    once; inside its transaction, or after a write that committed alone): announce them
    after commit, the quick executors' with one ring of the doorbell for all, the hosted ones'
    with one ring of theirs."""
    quick = hosted = False
    for dispatch in dispatches:
        executor = dispatch.task.agent.executor
        if executor in QUICK_EXECUTORS:
            quick = True
        elif is_hosted(executor):
            hosted = True
        elif executor != Executor.EXTERNAL:
            _announce_run(dispatch.pk, executor)
    if quick:
        transaction.on_commit(ring_for_due_dispatches, robust=True)
    if hosted:
        transaction.on_commit(ring_for_hosted_runs, robust=True)


@dataclass(frozen=True)
class DispatchClaim:
    """A dispatch this worker has claimed: run the task until `lease_expires_at`, renewing."""

    dispatch_id: int
    task_id: str
    progress: dict
    lease_expires_at: object
    executor: str = ""  # the task's agent's executor (Executor), when the claim read it
    # The parts of the task's latest user message, when the claim read them (quick claims:
    # `dispatch_claim_due`); None: the executor reads them if it needs them.
    user_parts: list | None = None
    # The task row as a quick claim read it, not locked (services.task_answer's `seen`).
    task: Task | None = None


def _lease_until():
    return timezone.now() + timedelta(seconds=settings.A2A_DISPATCH_LEASE_SECONDS)


def _claim(dispatch: ExecutorDispatch, worker: str) -> DispatchClaim:
    dispatch.state = DispatchState.CLAIMED
    dispatch.claims += 1
    dispatch.claimed_by = worker[:255]
    dispatch.lease_expires_at = _lease_until()
    dispatch.save(update_fields=["state", "claims", "claimed_by", "lease_expires_at", "updated_at"])
    lifecycle_log.info(
        "dispatch claimed",
        extra={"task_id": str(dispatch.task_id), "dispatch_id": dispatch.pk, "worker": worker},
    )
    return DispatchClaim(
        dispatch.pk, str(dispatch.task_id), dispatch.progress, dispatch.lease_expires_at
    )


def dispatch_claim(*, dispatch_id: int, worker: str) -> DispatchClaim | None:
    """Claim one dispatch for a Celery executor. None: gone, done, not yet due, or taken.

    A dispatch whose task is terminal is marked DONE (and None returned). A duplicate broker
    message finds the dispatch claimed (or locked) and does nothing. Only the dispatch row is
    locked (and skipped when locked): a task row busy with a lifecycle write is no reason to
    drop this job and leave the dispatch to the sweeper. One statement on PostgreSQL
    (task_store.claim_dispatch).
    """
    now = timezone.now()
    lease_until = now + timedelta(seconds=settings.A2A_DISPATCH_LEASE_SECONDS)
    # Atomic on its own: no transaction around it (no BEGIN and COMMIT round trips).
    row = get_task_store().claim_dispatch(dispatch_id, worker, now, lease_until)
    if row is None or not row.claimed:
        return None
    lifecycle_log.info(
        "dispatch claimed",
        extra={"task_id": str(row.task_id), "dispatch_id": dispatch_id, "worker": worker},
    )
    return DispatchClaim(
        dispatch_id, str(row.task_id), row.progress, row.lease_expires_at, row.executor
    )


def dispatch_claim_due(*, worker: str, limit: int = 1) -> list[DispatchClaim]:
    """Claim the oldest `limit` due dispatches of quick executors (QUICK_EXECUTORS) for a
    Celery worker, in one transaction; empty: there is none. Dispatches of finished tasks met
    on the way are marked DONE. Only those due for less than A2A_DISPATCH_UNCLAIMED_SECONDS
    are looked at (the dispatch_due index's range, whatever else waits in it): an older one is
    the sweeper's, which publishes its own job. Each claim's lease runs from now: the caller
    runs them in turn (a batch of quick runs ends well within the lease)."""
    now = timezone.now()
    lease_until = now + timedelta(seconds=settings.A2A_DISPATCH_LEASE_SECONDS)
    due_since = now - timedelta(seconds=settings.A2A_DISPATCH_UNCLAIMED_SECONDS)
    while True:
        # Atomic on its own: no transaction around it (no BEGIN and COMMIT round trips).
        rows = get_task_store().claim_next_dispatches(
            QUICK_EXECUTORS, due_since, worker, now, lease_until, limit
        )
        claimed = [row for row in rows if row.claimed]
        if claimed or not rows:  # met only finished tasks' dispatches: look again
            break
    for row in claimed:
        lifecycle_log.info(
            "dispatch claimed",
            extra={"task_id": str(row.task_id), "dispatch_id": row.dispatch_id, "worker": worker},
        )
    return [
        DispatchClaim(
            row.dispatch_id,
            str(row.task_id),
            row.progress,
            row.lease_expires_at,
            row.executor,
            row.user_parts,
            row.task,
        )
        for row in claimed
    ]


def dispatch_claim_next(*, agent: Agent, worker: str) -> DispatchClaim | None:
    """Claim the oldest due dispatch of an agent's tasks (external workers, REST API).

    Raises NotExternalExecutor for an agent a built-in executor runs: Celery runs its
    dispatches, and a claim here would race the executor job.
    """
    if agent.executor != Executor.EXTERNAL:
        raise NotExternalExecutor(agent.slug, agent.executor)
    with transaction.atomic():
        dispatch = (
            ExecutorDispatch.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("task")
            .filter(
                task__agent_id=agent.pk,
                state=DispatchState.PENDING,
                not_before__lte=timezone.now(),
            )
            .order_by("not_before", "id")
            .first()
        )
        if dispatch is None:
            return None
        return _claim(dispatch, worker)


def dispatch_renew(*, dispatch_ids: Sequence[int], worker: str) -> int:
    """Push the leases forward; how many of them are still `worker`'s (a lease lost was
    swept, or its task finished). One statement, atomic on its own."""
    return ExecutorDispatch.objects.filter(
        pk__in=dispatch_ids, state=DispatchState.CLAIMED, claimed_by=worker[:255]
    ).update(lease_expires_at=_lease_until(), updated_at=timezone.now())


def dispatch_finish(
    *,
    dispatch_id: int,
    worker: str,
    progress: dict | None = None,
    run_again_after: float | None = None,
) -> bool:
    """Release a claim: done, or pending again after `run_again_after` seconds (an ETA kept
    in the database, so a lost countdown message is caught by the sweeper).

    A client message that arrived during the claim (the task asked for input and the
    client answered before this release) found the dispatch still active and opened none:
    the dispatch then stays pending, due now, so the answer is run. The lifecycle services'
    lock order, task then dispatch: a racing client message has either committed (and is
    seen) or waits and then opens a dispatch itself (task_store.release_dispatch; two
    statements on PostgreSQL).
    """
    now = timezone.now()
    again_at = now + timedelta(seconds=run_again_after) if run_again_after is not None else None
    with transaction.atomic():
        released = get_task_store().release_dispatch(
            dispatch_id, worker, progress=progress, again_at=again_at, now=now
        )
        if released is None:
            return False
        if released.outcome != ReleaseOutcome.DONE and released.executor != Executor.EXTERNAL:
            countdown = run_again_after if released.outcome == ReleaseOutcome.AGAIN else None
            _announce_run(dispatch_id, released.executor, countdown)
    if released.outcome == ReleaseOutcome.INPUT:
        logger.info(
            "client input arrived during the run; dispatch pending again",
            extra={"task_id": str(released.task_id), "dispatch_id": dispatch_id},
        )
    return True


# How much of a failure's text a dispatch row keeps.
ERROR_MAX_CHARS = 20_000


def dispatch_record_error(*, dispatch_id: int, error: str) -> None:
    """Keep why a run failed its task on the dispatch row, for the console (a traceback: never
    on the wire). One statement, after the failure's own write."""
    ExecutorDispatch.objects.filter(pk=dispatch_id).update(error=error[:ERROR_MAX_CHARS])


@dataclass(frozen=True)
class StrandedSweep:
    """What `dispatch_sweep_stranded` did: dispatches re-enqueued, and the (task id, tries) of
    the dispatches it marked LOST, whose tasks the caller fails (tasks/sweeper.py)."""

    re_enqueued: int
    lost: list[tuple[object, int]]


def dispatch_sweep_stranded(*, now=None, batch: int = 500) -> StrandedSweep:
    """Re-enqueue stranded dispatches; mark LOST those whose tries are used up.

    Stranded: PENDING and due for longer than A2A_DISPATCH_UNCLAIMED_SECONDS (the broker
    message was lost, or no worker consumed it), or CLAIMED with an expired lease (the worker
    died). External-executor dispatches wait for a worker to poll, and hosted ones for a
    host's free slot (tasks/executors/host.py): only their lapsed leases count as tries, and
    a hosted one waiting long is announced again. Row level only: failing the lost
    dispatches' tasks is a lifecycle write, done by tasks.sweeper.dispatch_sweep after this
    transaction commits.
    """
    now = now or timezone.now()
    unclaimed_before = now - timedelta(seconds=settings.A2A_DISPATCH_UNCLAIMED_SECONDS)
    max_tries = settings.A2A_DISPATCH_MAX_TRIES
    re_enqueued = 0
    lost: list[tuple[object, int]] = []
    with transaction.atomic():
        stranded = list(
            ExecutorDispatch.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("task", "task__agent")
            .filter(
                Q(state=DispatchState.PENDING, not_before__lt=unclaimed_before)
                | Q(state=DispatchState.CLAIMED, lease_expires_at__lt=now)
            )
            .order_by("id")[:batch]
        )
        for dispatch in stranded:
            external = not _uses_celery(dispatch.task)
            lapsed = dispatch.state == DispatchState.CLAIMED
            if external and not lapsed:
                continue
            if external or is_hosted(dispatch.task.agent.executor):
                tries = dispatch.claims if lapsed else 0
            else:
                tries = dispatch.enqueues
            if tries >= max_tries:
                dispatch.state = DispatchState.LOST
                dispatch.lease_expires_at = None
                dispatch.save(update_fields=["state", "lease_expires_at", "updated_at"])
                lost.append((dispatch.task_id, tries))
                continue
            dispatch.state = DispatchState.PENDING
            dispatch.lease_expires_at = None
            dispatch.not_before = now
            _announce(dispatch)
            dispatch.save(
                update_fields=["state", "lease_expires_at", "not_before", "enqueues", "updated_at"]
            )
            re_enqueued += 1
            logger.warning(
                "dispatch re-enqueued",
                extra={"task_id": str(dispatch.task_id), "dispatch_id": dispatch.pk},
            )
    return StrandedSweep(re_enqueued, lost)
