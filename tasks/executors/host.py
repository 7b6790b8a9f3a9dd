"""The hosted runs of one worker process, on its event loop (issue 45; docs/agents.md).

A hosted executor's run does not hold a Celery slot. A new hosted dispatch rings the
doorbell (a2a_platform/lib/doorbell.py): the drain job watching it (`Host.drain`, on a Celery
thread for at most A2A_DISPATCH_DRAIN_SECONDS) claims the due ones into its host's free slots,
a batch per statement with their tasks read in one more, and lingers for the next ring; a
dispatch announced on its own (run again, new input, the sweeper's) has a job that claims it
(`Host.take`). Either way the job only hands the claim to this process's `Host`:
`execute()` runs on the host's event loop thread beside every other run of the process, so an
executor that awaits a model call for a second holds neither a thread nor a slot meanwhile.
The events it enqueues are written in order by the run's one writer on the ORM threads
(a2a_platform/lib/orm.py) as soon as the executor awaits anything: those enqueued together
in one transaction (start, an artifact and the end: one commit, not three).
`enqueue_event` returns once the event is queued, as on the SDK's server, and waits only
while MAX_UNWRITTEN events are queued.

Back-pressure: at most A2A_HOSTED_CONCURRENCY runs at once per process. A job that finds the
host full claims nothing and stops watching the bell (rings then publish jobs for other
workers' hosts); the dispatches stay PENDING (their tasks SUBMITTED, visibly) and the host
owes a claim: when a run ends it claims the oldest due ones it can run. A dispatch no host
took is announced again by the sweeper (tasks/dispatch.py); waiting for capacity never counts
as a try, a lapsed lease (a worker lost) does.

Cancel: one query per `POLL_SECONDS` for all the process's runs finds the tasks finished by
someone else (a CancelTask on any web instance); each such run gets the executor's `cancel()`,
then `execute()` is cancelled, as the SDK's server orders them. A write that finds its task
finished does the same. An `execute()` that does not stop within
A2A_HOSTED_STOP_GRACE_SECONDS is left to the loop (logged); its slot is freed.

A stopping worker (`Host.stop`) takes no new run, lets its runs go on for
A2A_HOSTED_SHUTDOWN_GRACE_SECONDS, then cancels those left and hands their dispatches back,
due at once, to run on another worker: a rolling deploy costs a re-run, not a try.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.types import a2a_pb2
from celery.signals import worker_process_shutdown, worker_shutdown
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from a2a_platform.lib.orm import run_orm
from a2a_platform.lib.reconnect import database_unreachable, with_reconnect
from agents.executor_spec import hosted_spec
from agents.models import Agent
from tasks import selectors, wire
from tasks.dispatch import (
    DispatchClaim,
    dispatch_claim,
    dispatch_record_error,
    ring_for_hosted_runs,
)
from tasks.errors import TaskTerminal
from tasks.executors import hosted, leases
from tasks.executors.base import ExecutorContext
from tasks.executors.runner import RERUN_AFTER_SECONDS, BellWatch, release_claim, run_span
from tasks.hooks import hooks_together
from tasks.job_names import RUN_DUE_HOSTED_JOB
from tasks.models import Task
from tasks.state_machine import IllegalTransition
from tasks.states import TERMINAL_STATES, TERMINAL_VALUES, TaskState
from tasks.task_store import get_task_store
from tasks.task_store.base import Snapshot

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How often the host looks for its runs' tasks finished by someone else (a cancel).
POLL_SECONDS = 0.5
# Events a run may have queued and not yet written before its `enqueue_event` waits.
MAX_UNWRITTEN = 64
# Runs' writes done in one transaction at most (a group commit).
WRITE_BATCH = 64
# Due hosted dispatches claimed by one statement of a drain.
HOSTED_CLAIM_BATCH = 50
# How long the list of hosted executors this process can run is used before it is read again
# (at once, when a claim found nothing for it and it is older than FRESH_SECONDS).
RUNNABLE_SECONDS = 2.0
FRESH_SECONDS = 0.2


class _Stop(asyncio.CancelledError):
    """Raised into `execute()` by an `enqueue_event` after its run stopped: a cancellation,
    so an executor's `except Exception` does not swallow it."""


@dataclass
class _Outcome:
    """How a run ended, for its release: `again_after` set, run it again after so many
    seconds (the database went away, or the worker is stopping); else released as done."""

    again_after: float | None = None


class _Queue(EventQueue):
    """The EventQueue an executor gets: each event goes to the run's writer (`_Run.write`).
    Events after the run are dropped, as the SDK drops events on a closed queue."""

    def __init__(self, run: _Run) -> None:
        self._run = run

    async def enqueue_event(self, event: Any) -> None:
        if self._run.closed:
            logger.warning(
                "an event enqueued after its run ended was dropped", extra=self._run.extra
            )
            return
        await self._run.write(event)


class _Dropping(EventQueue):
    """The queue `cancel()` gets: the task is CANCELED already, its events change nothing."""

    async def enqueue_event(self, event: Any) -> None:
        logger.debug("event from cancel() dropped (task canceled)")


class _Run:
    """One hosted run: `execute()` on the loop, its events written on the ORM threads."""

    def __init__(
        self, host: Host, claim: DispatchClaim, worker: str, snapshot: Snapshot | None = None
    ) -> None:
        self.host = host
        self.claim = claim
        self.snapshot = snapshot  # the task as its batch's claim read it (None: read it)
        self.worker = worker
        self.task_id = claim.task_id
        self.ctx = ExecutorContext(task_id=claim.task_id, progress=dict(claim.progress))
        self.extra = {"task_id": claim.task_id, "dispatch_id": claim.dispatch_id}
        self.closed = False
        self.canceled = asyncio.Event()  # the task finished by someone else
        self.outcome = _Outcome()
        self.stopped = False
        self.unwritten: list[Any] = []  # events enqueued, not yet handed to a write
        self.writing: asyncio.Task | None = None  # the run's one writer, while it writes
        self.execution: asyncio.Task | None = None
        self.executor: AgentExecutor | None = None
        self.request: RequestContext | None = None
        self.writer: hosted.EventWriter | None = None
        self.trace = ("", "")  # the task's W3C trace context, read with it

    # --- the run ---
    async def main(self) -> None:
        prepared = None
        if self.snapshot is not None and hosted.loaded(self.claim.executor):
            # Its task read by its batch's claim and its executor loaded, a run has nothing to
            # ask the database before execute(): no thread hop.
            prepared = self._prepare()
        if prepared is None:
            prepared = await run_orm(self._prepare)
        if not prepared or self.stopped:
            return
        self.execution = asyncio.ensure_future(self._execute())
        canceled = asyncio.ensure_future(self.canceled.wait())
        try:
            await asyncio.wait({self.execution, canceled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            canceled.cancel()
        if self.execution.done() and not self.stopped:
            await self._written()  # what execute() enqueued before it returned
        if self.canceled.is_set() and not self.stopped:
            await self._cancel()
        elif not self.stopped:
            error = self.execution.result()
            if error is not None or not self._settled():
                await run_orm(functools.partial(self._done, error))
        await self._stopped()

    def _prepare(self) -> bool:
        """Load the executor, read the task, build its RequestContext; False: nothing to run
        (the task is finished, or the executor cannot be loaded here: the task fails)."""
        spec = hosted_spec(self.claim.executor)
        try:
            self.executor = hosted.load(spec)
        except Exception:
            logger.exception("hosted executor cannot be loaded; failing the task", extra=self.extra)
            self.fail(
                "The agent's executor could not be loaded on this worker.", traceback.format_exc()
            )
            return False
        if self.snapshot is None:
            task = Task.objects.select_related("agent").get(pk=self.task_id)
        else:
            task = self.snapshot[0]
        if task.task_state in TERMINAL_STATES:
            return False
        self.trace = (task.traceparent, task.tracestate)
        self.request = hosted.request_context(task, self.snapshot)
        self.snapshot = None
        self.writer = hosted.EventWriter(self.ctx, self.request, task.task_state)
        return True

    async def _execute(self) -> BaseException | None:
        """`execute()`; what it raised (None: it returned). Its cancellation by this run is
        not an error of the executor's."""
        try:
            with run_span(self.claim, self.trace):
                await self.executor.execute(self.request, _Queue(self))
        except asyncio.CancelledError as exc:
            # Cancelled by this run (stopped, or its task canceled), or by the executor itself
            # (an error like any other).
            return None if self.stopped or self.canceled.is_set() else exc
        except BaseException as exc:  # noqa: BLE001 (the executor's failure, reported)
            return exc
        finally:
            self.closed = True
        return None

    def _settled(self) -> bool:
        """The task is terminal, or waits for the client: nothing to fail."""
        return self.ctx.finished or self.writer.state in (
            TaskState.INPUT_REQUIRED,
            TaskState.AUTH_REQUIRED,
        )

    def _done(self, error: BaseException | None) -> None:
        """`execute()` ended on its own: a task it left unfinished, or an error, fails it."""
        if error is not None:
            logger.error(
                "hosted executor raised; failing the task",
                exc_info=(type(error), error, error.__traceback__),
                extra=self.extra,
            )
            if not self.ctx.finished:
                trace = "".join(traceback.format_exception(error))
                self.fail(f"The agent failed: {type(error).__name__}.", trace)
            return
        if self._settled():
            return
        # Nothing else can move the task once execute() has returned: left WORKING (or
        # SUBMITTED) it would hang for good. The SDK's server leaves it so; here it is a
        # failure the client can read (docs/decisions.md, "Hosted executors").
        logger.error(
            "hosted executor returned leaving the task %s; failing it",
            self.writer.state.short,
            extra=self.extra,
        )
        text = f"The agent stopped without finishing the task (left {self.writer.state.short})."
        self.fail(text, text)

    def fail(self, text: str, detail: str) -> None:
        """Fail the task with `text` (the client reads it) and keep `detail` (a traceback,
        the refusal) on the dispatch row for the console (ORM thread)."""
        hosted.fail(self.ctx, text)
        dispatch_record_error(dispatch_id=self.claim.dispatch_id, error=detail)

    # --- events ---
    async def write(self, event: Any) -> None:
        """Queue one event for the run's writer and return, as the SDK's queue does; wait
        only while MAX_UNWRITTEN are queued (back-pressure)."""
        if self.stopped or self.canceled.is_set():
            raise _Stop("the run is stopping")
        self.unwritten.append(event)
        if self.writing is None or self.writing.done():
            self.writing = asyncio.ensure_future(self._write_queued())
        if len(self.unwritten) >= MAX_UNWRITTEN:
            await asyncio.shield(self.writing)

    async def _written(self) -> None:
        if self.writing is not None:
            await asyncio.shield(self.writing)

    async def _write_queued(self) -> None:
        """Write the queued events in order, those queued together in one transaction (a
        burst of events with no await between them: one commit, one NOTIFY, one outbox
        statement). A refused event fails the task and stops `execute()`; a task finished
        by someone else cancels the run; a database outage stops it, to run again shortly."""
        while self.unwritten and not (self.stopped or self.canceled.is_set()):
            events, self.unwritten = self.unwritten, []
            try:
                await self.host.write(self, events)
            except hosted.Refused as refused:
                logger.error(
                    "hosted executor event refused: %s; failing the task", refused, extra=self.extra
                )
                text = f"The agent sent an invalid event: {refused}"
                await run_orm(functools.partial(self.fail, text, text))
                self._stop()
            except (TaskTerminal, IllegalTransition):
                # Finished by someone else (a cancel; EventWriter raises only those): `main`
                # calls cancel() first, then cancels execute().
                self.canceled.set()
            except Exception as exc:
                if database_unreachable(exc):
                    logger.warning(
                        "database unreachable during the run; running it again shortly",
                        extra=self.extra,
                    )
                    self._stop(again_after=RERUN_AFTER_SECONDS)
                else:
                    logger.exception("hosted event write failed; failing it", extra=self.extra)
                    trace = "".join(traceback.format_exception(exc))
                    await run_orm(functools.partial(self.fail, "executor error", trace))
                    self._stop()

    def _stop(self, again_after: float | None = None) -> None:
        """Stop the run early: `execute()` is cancelled, its queued events dropped."""
        self.stopped = True
        self.outcome.again_after = again_after
        self.unwritten.clear()
        if self.execution is not None:
            self.execution.cancel()

    async def _cancel(self) -> None:
        """The task was finished by someone else: the executor's `cancel()`, then `execute()`
        cancelled, as the SDK's server orders them."""
        logger.info("task finished while its hosted executor ran; canceling it", extra=self.extra)
        task = await run_orm(lambda: Task.objects.select_related("agent").get(pk=self.task_id))
        context = RequestContext(
            call_context=self.request.call_context,
            task_id=self.task_id,
            context_id=task.context_id,
            task=wire.parse_dict(wire.task_json(task), a2a_pb2.Task),
        )
        try:
            await asyncio.wait_for(
                self.executor.cancel(context, _Dropping()), settings.A2A_HOSTED_STOP_GRACE_SECONDS
            )
        except TimeoutError:
            logger.error("hosted executor's cancel() did not return in time", extra=self.extra)
        except Exception:
            logger.exception("hosted executor's cancel() raised", extra=self.extra)
        self.stopped = True

    async def _stopped(self) -> None:
        """Cancel `execute()` if it still runs and give it its grace."""
        execution = self.execution
        if execution is None or execution.done():
            return
        execution.cancel()
        await asyncio.wait({execution}, timeout=settings.A2A_HOSTED_STOP_GRACE_SECONDS)
        if not execution.done():
            logger.error(
                "hosted executor did not stop within its grace; left running", extra=self.extra
            )

    def hand_back(self) -> None:
        """The worker is stopping: stop the run; its dispatch is due again at once."""
        self._stop(again_after=0)

    def owes_release(self) -> bool:
        """Not after a terminal answer: its transaction closed the dispatch."""
        return self.outcome.again_after is not None or not self.ctx.finished

    def release(self) -> None:
        """Release the claim (ORM thread): done, or pending again when asked to."""
        release_claim(
            self.claim,
            self.worker,
            progress=self.ctx.progress,
            run_again_after=self.outcome.again_after,
        )


class Host:
    """This process's hosted runs: its loop thread, the slots, the cancel watch."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="hosted-executors", daemon=True).start()
        self.name = f"{socket.gethostname()}:host:{os.getpid()}"
        self._lock = threading.Lock()
        self._slots = 0  # taken by runs, started or about to be
        self._owed = False  # a dispatch was left waiting for a slot: claim when one frees
        self._accepting = True
        self._runs: dict[str, _Run] = {}  # by task id; the loop thread's
        self._writes: list[tuple[_Run, list[Any], asyncio.Future]] = []  # the loop thread's
        self._writer: asyncio.Task | None = None
        self._watching = False

    # --- slots (any thread) ---
    def _take_slot(self) -> bool:
        with self._lock:
            if not self._accepting or self._slots >= settings.A2A_HOSTED_CONCURRENCY:
                self._owed = self._accepting
                return False
            self._slots += 1
            return True

    def _free_slots(self, count: int = 1) -> None:
        with self._lock:
            self._slots -= count

    @property
    def in_flight(self) -> int:
        return self._slots

    # --- starting runs ---
    def take(self, *, dispatch_id: int, worker: str) -> str:
        """A hosted dispatch's job (on its Celery thread): claim it and start its run here;
        returns at once. What happened: started, skipped (not claimable) or waiting (no slot:
        the dispatch stays PENDING for this host or another)."""
        if not self._take_slot():
            logger.info(
                "hosted runs at their limit; dispatch left waiting",
                extra={"dispatch_id": dispatch_id},
            )
            return "waiting"
        claim = None
        try:
            claim = with_reconnect(
                lambda: dispatch_claim(dispatch_id=dispatch_id, worker=worker),
                what="dispatch claim",
                extra={"dispatch_id": dispatch_id},
            )
        finally:
            if claim is None:
                self._free_slots()
        if claim is None:
            return "skipped"
        self._start(claim, worker)
        return "started"

    def _start(self, claim: DispatchClaim, worker: str, snapshot: Snapshot | None = None) -> None:
        asyncio.run_coroutine_threadsafe(self._run(claim, worker, snapshot), self.loop)

    async def _run(self, claim: DispatchClaim, worker: str, snapshot: Snapshot | None) -> None:
        run = _Run(self, claim, worker, snapshot)
        self._runs[claim.task_id] = run
        self._watch()
        try:
            with leases.keeper().renewing(claim.dispatch_id, worker):
                try:
                    await run.main()
                except Exception as exc:
                    if database_unreachable(exc):
                        run.outcome.again_after = RERUN_AFTER_SECONDS
                    else:
                        logger.exception("hosted run failed; failing the task", extra=run.extra)
                        trace = "".join(traceback.format_exception(exc))
                        await run_orm(functools.partial(run.fail, "executor error", trace))
            if run.owes_release():
                await run_orm(run.release)
        except Exception:
            logger.exception("hosted run could not be released", extra=run.extra)
        finally:
            self._runs.pop(claim.task_id, None)
            self._free_slots()
            await self._claim_owed()

    def claim_due(self, worker: str, most: int) -> tuple[int, int]:
        """Claim up to `most` due hosted dispatches (no more than the free slots), read their
        tasks in one statement and start their runs; (how many were asked for, how many were
        claimed). Any thread that may query: a drain job's, or an ORM thread."""
        with self._lock:
            asked = min(most, settings.A2A_HOSTED_CONCURRENCY - self._slots)
            if asked <= 0 or not self._accepting:
                self._owed = self._accepting
                return 0, 0
            self._slots += asked
        claimed: list[tuple[DispatchClaim, Snapshot]] = []
        try:
            claimed = _claim_due_hosted(worker, asked)
        finally:
            self._free_slots(asked - len(claimed))
        for claim, snapshot in claimed:
            self._start(claim, worker, snapshot)
        return asked, len(claimed)

    def drain(self, *, worker: str, linger: float, seconds: float | None = None) -> int:
        """A RUN_DUE_HOSTED_JOB (on its Celery thread): claim the due hosted dispatches into
        this host's free slots, a batch per statement, watching the bell meanwhile (new ones
        ring it instead of publishing a job) and waiting up to `linger` for a ring when out
        of work, for `seconds` at most (A2A_DISPATCH_DRAIN_SECONDS). A full host stops
        watching, so rings publish jobs for other workers' hosts, and owes a claim for when
        a run ends. Returns how many runs it started; the runs go on after it returns."""
        if seconds is None:
            seconds = settings.A2A_DISPATCH_DRAIN_SECONDS
        deadline = time.monotonic() + seconds
        watch = BellWatch(RUN_DUE_HOSTED_JOB, linger)
        started, more = 0, False
        try:
            while True:
                watch.watch()
                asked, got = self.claim_due(worker, HOSTED_CLAIM_BATCH)
                started += got
                if asked == 0:
                    break  # full: the host owes a claim
                more = got == asked
                if time.monotonic() >= deadline:
                    break
                if not more and not watch.wait(deadline):
                    break
        finally:
            watch.stop()
        if not more:
            # What rang while the bell was watched published no job: claimed here.
            asked, got = self.claim_due(worker, HOSTED_CLAIM_BATCH)
            started += got
            more = asked > 0 and got == asked
        if more:
            ring_for_hosted_runs()  # stopped with work left: a fresh drain for it
        return started

    async def _claim_owed(self) -> None:
        """A slot freed while dispatches wait for one: claim the oldest due ones this host
        can run, up to its free slots."""
        if not self._owed:
            return
        self._owed = False
        try:
            asked, got = await run_orm(
                functools.partial(self.claim_due, self.name, settings.A2A_HOSTED_CONCURRENCY)
            )
        except Exception:
            logger.exception("claiming waiting hosted dispatches failed")
            return
        if asked and got == asked:
            self._owed = True  # more may wait

    # --- writes (loop thread) ---
    async def write(self, run: _Run, events: list[Any]) -> None:
        """Write a run's events (`EventWriter.write_all`), with those of the other runs that
        asked meanwhile: one ORM call and one transaction for all of them while the previous
        one was under way (a group commit: one COMMIT and one outbox statement for the
        batch). Raises what the run's own write raised."""
        done = self.loop.create_future()
        self._writes.append((run, events, done))
        if self._writer is None or self._writer.done():
            self._writer = self.loop.create_task(self._write_batches())
        await done

    async def _write_batches(self) -> None:
        while self._writes:
            batch, self._writes = self._writes[:WRITE_BATCH], self._writes[WRITE_BATCH:]
            try:
                if len(batch) == 1:
                    run, events, _ = batch[0]
                    errors = [None]
                    try:
                        await run_orm(functools.partial(run.writer.write_all, events))
                    except Exception as exc:
                        errors = [exc]
                else:
                    errors = await run_orm(functools.partial(_write_together, batch))
            except BaseException as exc:  # the loop stopping: no write's caller waits forever
                errors = [exc] * len(batch)
            for (_, _, done), error in zip(batch, errors, strict=True):
                if done.done():
                    continue
                if error is None:
                    done.set_result(None)
                else:
                    done.set_exception(error)

    # --- cancel watch (loop thread) ---
    def _watch(self) -> None:
        if not self._watching:
            self._watching = True
            self.loop.create_task(self._watch_for_cancels())

    async def _watch_for_cancels(self) -> None:
        """Every POLL_SECONDS while runs go on: one query for the tasks finished by someone
        else among this process's runs."""
        try:
            while self._runs:
                await asyncio.sleep(POLL_SECONDS)
                live = [run.task_id for run in self._runs.values() if _watched(run)]
                if not live:
                    continue
                try:
                    finished = await run_orm(functools.partial(_finished_among, live))
                except Exception:
                    logger.warning("cancel watch query failed; trying again", exc_info=True)
                    continue
                for task_id in finished:
                    run = self._runs.get(task_id)
                    if run is not None and _watched(run):
                        run.canceled.set()
        finally:
            self._watching = False

    # --- stopping ---
    def stop(self, grace: float | None = None) -> int:
        """The worker is stopping (any thread but the loop's): take no new run, let the runs
        go on for `grace` seconds, then hand back those left; how many were handed back."""
        if grace is None:
            grace = settings.A2A_HOSTED_SHUTDOWN_GRACE_SECONDS
        with self._lock:
            self._accepting = False
            self._owed = False
        deadline = time.monotonic() + grace
        while self._slots and time.monotonic() < deadline:
            time.sleep(0.1)
        if not self._slots:
            return 0
        left = self._call_on_loop(lambda: list(self._runs.values()))
        logger.warning("worker stopping: handing back %d hosted runs", len(left))
        for run in left:
            self.loop.call_soon_threadsafe(run.hand_back)
        deadline = time.monotonic() + settings.A2A_HOSTED_STOP_GRACE_SECONDS + 2
        while self._slots and time.monotonic() < deadline:
            time.sleep(0.1)
        return len(left)

    def _call_on_loop(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=5)


def _write_together(batch: list[tuple[_Run, list[Any], asyncio.Future]]) -> list:
    """Several runs' events (ORM thread): those of status and artifact updates only in one
    transaction, the event hooks once for all; each run's error (None: written). If any of
    them raises, the transaction is rolled back and each is written again on its own, where
    its error is its own; a run that sent a Message or a Task is written on its own too."""
    updates_only = [all(isinstance(e, hosted.UPDATES) for e in events) for _, events, _ in batch]
    together = [run for (run, _, _), only in zip(batch, updates_only, strict=True) if only]
    checkpoints = {id(run): run.writer.checkpoint() for run in together}
    try:
        with transaction.atomic(), hooks_together():
            for (run, events, _), only in zip(batch, updates_only, strict=True):
                if only:
                    run.writer.write_together(events)
        done = set(checkpoints)
    except Exception:
        for run in together:
            run.writer.restore(checkpoints[id(run)])
        done = set()
    errors: list[Exception | None] = []
    for run, events, _ in batch:
        if id(run) in done:
            errors.append(None)
            continue
        try:
            run.writer.write_all(events)
            errors.append(None)
        except Exception as exc:
            errors.append(exc)
    return errors


def _watched(run: _Run) -> bool:
    return not (run.ctx.finished or run.canceled.is_set() or run.stopped)


def _finished_among(task_ids: list[str]) -> list[str]:
    rows = Task.objects.filter(pk__in=task_ids, state__in=TERMINAL_VALUES).values_list(
        "pk", flat=True
    )
    return [str(pk) for pk in rows]


def _claim_due_hosted(worker: str, limit: int) -> list[tuple[DispatchClaim, Snapshot]]:
    """Claim up to `limit` due dispatches of the hosted executors this process can load (one
    statement), with their tasks as runs see them: history and artifacts (one statement for
    all) and their agents (one)."""
    rows = _claim_rows(worker, limit, _runnable_specs())
    if not rows and _runnable_read_at() < time.monotonic() - FRESH_SECONDS:
        # Nothing for the executors known: maybe for one named since (a new agent).
        rows = _claim_rows(worker, limit, _runnable_specs(fresh=True))
    if not rows:
        return []
    keys = [
        selectors.snapshot_key(
            agent_id=row.task.agent_id,
            owner=row.task.owner,
            task_id=row.task_id,
            history_length=None,
        )
        for row in rows
    ]
    claimed = []
    for row, snapshot in zip(rows, selectors.task_snapshots_for_owner(keys=keys), strict=True):
        claim = DispatchClaim(
            row.dispatch_id, str(row.task_id), row.progress, row.lease_expires_at, row.executor
        )
        if snapshot is not None:
            # What a run reads of its agent is its slug, which never changes.
            snapshot[0].agent = _agent(row.task.agent_id)
        claimed.append((claim, snapshot))
    return claimed


_agents: dict[int, Agent] = {}


def _agent(pk: int) -> Agent:
    """An agent by id, read once per process (a run reads its slug only: never edited)."""
    agent = _agents.get(pk)
    if agent is None:
        agent = _agents[pk] = Agent.objects.only("id", "slug").get(pk=pk)
    return agent


def _claim_rows(worker: str, limit: int, runnable: tuple[str, ...]) -> list:
    if not runnable:
        return []
    now = timezone.now()
    rows = get_task_store().claim_next_dispatches(
        runnable,
        now - timedelta(seconds=settings.A2A_DISPATCH_UNCLAIMED_SECONDS),
        worker,
        now,
        now + timedelta(seconds=settings.A2A_DISPATCH_LEASE_SECONDS),
        limit,
    )
    return [row for row in rows if row.claimed]


_runnable: tuple[float, tuple[str, ...]] = (-math.inf, ())


def _runnable_read_at() -> float:
    return _runnable[0]


def _runnable_specs(*, fresh: bool = False) -> tuple[str, ...]:
    """The enabled agents' hosted executors this process can load, read again every
    RUNNABLE_SECONDS (a claim per ring must not cost a query for them), or now (`fresh`)."""
    global _runnable
    read_at, specs = _runnable
    if fresh or time.monotonic() - read_at >= RUNNABLE_SECONDS:
        from agents.readiness import hosted_specs

        specs = tuple(spec for spec in hosted_specs() if hosted.load_check(spec) is None)
        _runnable = (time.monotonic(), specs)
    return specs


_host: Host | None = None
_host_pid = 0
_host_lock = threading.Lock()


def host() -> Host:
    """This process's host (a forked child gets its own: threads do not survive a fork)."""
    global _host, _host_pid
    with _host_lock:
        if _host is None or _host_pid != os.getpid():
            _host, _host_pid = Host(), os.getpid()
        return _host


def stop_if_started() -> int:
    """At worker shutdown: stop this process's host if it ran anything."""
    with _host_lock:
        current = _host if _host_pid == os.getpid() else None
    if current is None:
        return 0
    with contextlib.suppress(Exception):
        return current.stop()
    return 0


# A stopping worker stops its host: the threads pool's (and solo's) in the main process once
# the consumer stopped, each prefork child as it exits. Connected when a process first hosts.
worker_shutdown.connect(lambda **kwargs: stop_if_started(), weak=False)
worker_process_shutdown.connect(lambda **kwargs: stop_if_started(), weak=False)
