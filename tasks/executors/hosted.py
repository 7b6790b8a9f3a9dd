"""Hosted executors: an a2a-sdk `AgentExecutor` named `python:<module>:<attribute>`, run on
the workers (issue 45; agents/executor_spec.py parses the name).

`load(spec)` imports and constructs it once per process. `run(spec, ctx)` is one dispatch run,
called by the runner on its Celery thread like any executor: it builds the `RequestContext`
as the SDK's server does (the triggering user message, `task_id`, `context_id`, the stored
task with its history as `current_task`, the caller in `call_context`) and runs `execute()` on
the process's one event loop thread (`event_loop()`: many runs share it). The `EventQueue` the
executor gets hands each event to the run's thread, which writes it through the lifecycle
services before `enqueue_event` returns: events are written in order, as they come, and a
fast executor waits for the store (back-pressure).

    TaskStatusUpdateEvent    a transition, with its status message (the state machine checks it)
    TaskArtifactUpdateEvent  an artifact, or a chunk of one (`append`, `lastChunk`)
    Message                  a direct answer (services.task_reply_with_message: SendMessage
                             returns `{"message": …}`); only as the run's first event
    Task                     its state, when it differs from the stored one; its artifacts
                             the store has not

An event that breaks the lifecycle (another task's id, a move the state machine refuses, an
append to an unknown artifact, a payload the services refuse) is refused with a log line, and
the task ends FAILED; an exception in `execute()` ends it FAILED with a status message that
names the exception's type only (the trace is logged). A task canceled while `execute()` runs
(seen by polling the task's state every `POLL_SECONDS`) gets the executor's `cancel()`, then
`execute()` is cancelled; the store already holds CANCELED.

First step: the run holds its Celery thread until `execute()` returns (docs/agents.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from a2a.auth.user import User
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.types import a2a_pb2

from agents.executor_spec import HostedSpec, hosted_spec
from tasks import selectors, services, wire
from tasks.errors import InvalidPayload, TaskTerminal
from tasks.executors.base import ExecutorContext, RunAgain
from tasks.models import MessageRole, Task
from tasks.state_machine import IllegalTransition
from tasks.states import TERMINAL_STATES, TERMINAL_VALUES, TaskState

logger = logging.getLogger(__name__)

# How often a run waiting for its executor's next event looks for a cancel of its task.
POLL_SECONDS = 0.5
# How long a stopped `execute()` (canceled, refused, failed) and an executor's `cancel()` get
# to end before the run gives up on them (the coroutine is left to the loop).
STOP_GRACE_SECONDS = 5.0

# --- loading ------------------------------------------------------------------------------

_executors: dict[HostedSpec, AgentExecutor] = {}
_executors_lock = threading.Lock()


def load(spec: HostedSpec) -> AgentExecutor:
    """The executor `spec` names, imported and constructed once per process. Raises what the
    import or the construction raised, or TypeError when it is not an AgentExecutor."""
    with _executors_lock:
        executor = _executors.get(spec)
        if executor is None:
            executor = _executors[spec] = _construct(spec)
        return executor


def _parsed(value: str) -> HostedSpec:
    spec = hosted_spec(value)
    if spec is None:
        raise ValueError(f"{value[:80]!r} names no hosted executor")
    return spec


def _construct(spec: HostedSpec) -> AgentExecutor:
    module = importlib.import_module(spec.module)
    try:
        target = getattr(module, spec.attribute)
    except AttributeError:
        problem = f"module {spec.module!r} has no attribute {spec.attribute!r}"
        raise AttributeError(problem) from None
    if isinstance(target, type) and not issubclass(target, AgentExecutor):
        raise TypeError(f"{spec} is a class but not an a2a-sdk AgentExecutor subclass")
    if not callable(target):
        raise TypeError(f"{spec} is neither an AgentExecutor subclass nor a callable")
    executor = target()
    if not isinstance(executor, AgentExecutor):
        raise TypeError(f"{spec}() returned {type(executor).__name__}, not an AgentExecutor")
    return executor


def load_check(spec: HostedSpec | str) -> str | None:
    """None when this process can load `spec` (a HostedSpec or its `python:` text); else the
    failure in one line (readiness: a worker reports it per hosted agent)."""
    try:
        load(spec if isinstance(spec, HostedSpec) else _parsed(spec))
    except Exception as exc:
        line = (str(exc).splitlines() or [""])[0]
        return f"{type(exc).__name__}: {line}"[:300]
    return None


# --- the event loop -----------------------------------------------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_loop_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop for hosted executions, running on a daemon thread of its own
    (started at first use, and again in a forked child)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="hosted-executors", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


# --- what the executor sees ---------------------------------------------------------------


class PlatformUser(User):
    """The caller: the task's owner (`key:<api key id>` or `anonymous`)."""

    def __init__(self, owner: str) -> None:
        self._owner = owner

    @property
    def is_authenticated(self) -> bool:
        return self._owner != "anonymous"

    @property
    def user_name(self) -> str:
        return self._owner


def request_context(task: Task) -> RequestContext:
    """The RequestContext of a run of `task` (its agent loaded), as the SDK's server builds it
    for a message to a stored task: the latest user message, the task as `current_task` (its
    whole history and artifacts)."""
    history = selectors.task_history(task, None)
    for row in history:
        row.task = task  # stored_message_json reads the task's context id
    pb_task = wire.parse_dict(
        wire.task_json(task, history=history, artifacts=selectors.task_artifacts(task)),
        a2a_pb2.Task,
    )
    users = [row for row in history if row.role == MessageRole.USER]
    request = None
    if users:
        message = wire.parse_dict(wire.stored_message_json(users[-1]), a2a_pb2.Message)
        request = a2a_pb2.SendMessageRequest(message=message)
    call = ServerCallContext(
        user=PlatformUser(task.owner),
        tenant=task.agent.slug,
        state={"agent": task.agent.slug, "owner": task.owner},
    )
    return RequestContext(
        call_context=call,
        request=request,
        task_id=str(task.id),
        context_id=task.context_id,
        task=pb_task,
    )


@dataclass
class _Done:
    error: BaseException | None


class _Handoff(EventQueue):
    """The EventQueue an executor gets: each event goes to the run's thread, which writes it
    (or refuses it); `enqueue_event` returns once it has. Events after the run are dropped,
    as the SDK drops events enqueued on a closed queue."""

    def __init__(self, items: queue.SimpleQueue) -> None:
        self._items = items
        self.closed = False

    async def enqueue_event(self, event: Any) -> None:
        if self.closed:
            logger.warning("an event enqueued after its run ended was dropped")
            return
        written = asyncio.get_running_loop().create_future()
        self._items.put((event, written))
        await written


class _Dropping(EventQueue):
    """The queue `cancel()` gets: the task is CANCELED already, its events change nothing."""

    async def enqueue_event(self, event: Any) -> None:
        logger.debug("event from cancel() dropped (task canceled)")


# --- one run --------------------------------------------------------------------------------


class _Refused(Exception):
    """An event that breaks the task's lifecycle."""


def run(spec: HostedSpec, ctx: ExecutorContext) -> RunAgain | None:
    """One dispatch run of a hosted executor (the runner's Executor signature)."""
    extra = {"task_id": ctx.task_id, "executor": str(spec)}
    try:
        executor = load(spec)
    except Exception:
        logger.exception("hosted executor cannot be loaded; failing the task", extra=extra)
        _fail(ctx, "The agent's executor could not be loaded on this worker.")
        return None
    task = ctx.task()
    if task.task_state in TERMINAL_STATES:
        return None
    _Run(executor, request_context(task), task.task_state, ctx, extra).consume()
    return None


def _fail(ctx: ExecutorContext, text: str) -> None:
    with contextlib.suppress(TaskTerminal, IllegalTransition):
        services.task_transition(task_id=ctx.task_id, to_state=TaskState.FAILED, message=text)
    ctx.finished = True


def _resolve(written: asyncio.Future, error: BaseException | None = None) -> None:
    if written.done():
        return
    if error is None:
        written.set_result(None)
    else:
        written.cancel()


class _Run:
    """`execute()` on the event loop; its events written on this (the runner's) thread."""

    def __init__(
        self,
        executor: AgentExecutor,
        request: RequestContext,
        state: TaskState,
        ctx: ExecutorContext,
        extra: dict[str, Any],
    ) -> None:
        self.executor = executor
        self.request = request
        self.state = state
        self.ctx = ctx
        self.extra = extra
        self.task_id = ctx.task_id
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.queue = _Handoff(self.items)
        self.loop = event_loop()
        self.wrote_task_event = False
        self.stopping_until: float | None = None
        self.future = asyncio.run_coroutine_threadsafe(self._execute(), self.loop)

    async def _execute(self) -> None:
        error: BaseException | None = None
        try:
            await self.executor.execute(self.request, self.queue)
        except BaseException as exc:  # noqa: BLE001 (reported to the run's thread)
            error = exc
        finally:
            self.queue.closed = True
            self.items.put(_Done(error))

    # --- the run's thread ---
    def consume(self) -> None:
        """Write each event as it comes until `execute()` ends (or, stopped, its grace ends).
        Raises, after stopping `execute()`, what the runner handles: TaskTerminal (canceled
        meanwhile: the executor's `cancel()` was called) and a database outage."""
        raise_after: BaseException | None = None
        while True:
            try:
                item = self.items.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if self.stopping_until is not None:
                    if time.monotonic() >= self.stopping_until:
                        logger.error(
                            "hosted executor did not stop within its grace; left running",
                            extra=self.extra,
                        )
                        break
                elif self._canceled_meanwhile():
                    raise_after = self._cancel()
                continue
            if isinstance(item, _Done):
                self._done(item.error)
                break
            event, written = item
            if self.stopping_until is not None:
                self.loop.call_soon_threadsafe(_resolve, written, _Refused())
                continue
            try:
                self._write(event)
            except _Refused as refused:
                logger.error(
                    "hosted executor event refused: %s; failing the task",
                    refused,
                    extra=self.extra,
                )
                if not self.ctx.finished:
                    _fail(self.ctx, f"The agent sent an invalid event: {refused}")
                self.loop.call_soon_threadsafe(_resolve, written, refused)
                self._stop()
                continue
            except (TaskTerminal, IllegalTransition) as exc:
                # Finished under our feet: a cancel (or the sweeper's give-up).
                self.loop.call_soon_threadsafe(_resolve, written, exc)
                raise_after = self._cancel()
                continue
            except BaseException as exc:
                # The database gone, or a bug here: stop execute(), then let the runner
                # handle it as it handles any executor's.
                self.loop.call_soon_threadsafe(_resolve, written, exc)
                self._stop()
                raise_after = exc
                continue
            self.loop.call_soon_threadsafe(_resolve, written)
        if raise_after is not None:
            raise raise_after

    def _stop(self) -> None:
        if self.stopping_until is None:
            self.stopping_until = time.monotonic() + STOP_GRACE_SECONDS
            self.future.cancel()

    def _canceled_meanwhile(self) -> bool:
        if self.ctx.finished:
            return False
        state = Task.objects.filter(pk=self.task_id).values_list("state", flat=True).first()
        return state is None or state in TERMINAL_VALUES

    def _cancel(self) -> TaskTerminal:
        """The task was canceled (or otherwise finished) by someone else: the executor's
        `cancel()`, then `execute()` cancelled, as the SDK's server orders them."""
        logger.info("task finished while its hosted executor ran; canceling it", extra=self.extra)
        task = Task.objects.select_related("agent").get(pk=self.task_id)
        cancel_context = RequestContext(
            call_context=self.request.call_context,
            task_id=self.task_id,
            context_id=task.context_id,
            task=wire.parse_dict(wire.task_json(task), a2a_pb2.Task),
        )
        canceling = asyncio.run_coroutine_threadsafe(
            self.executor.cancel(cancel_context, _Dropping()), self.loop
        )
        try:
            canceling.result(timeout=STOP_GRACE_SECONDS)
        except concurrent.futures.TimeoutError:
            canceling.cancel()
            logger.error("hosted executor's cancel() did not return in time", extra=self.extra)
        except Exception:
            logger.exception("hosted executor's cancel() raised", extra=self.extra)
        self._stop()
        return TaskTerminal(self.task_id, task.state)

    def _done(self, error: BaseException | None) -> None:
        if self.stopping_until is not None:
            return
        if error is None:
            if not self.ctx.finished and self.state not in (
                TaskState.INPUT_REQUIRED,
                TaskState.AUTH_REQUIRED,
            ):
                # Nothing else can move the task once execute() has returned: left WORKING
                # (or SUBMITTED) it would hang for good. The SDK's server leaves it so; here
                # it is a failure the client can read (docs/decisions.md, "Hosted executors").
                logger.error(
                    "hosted executor returned leaving the task %s; failing it",
                    self.state.short,
                    extra=self.extra,
                )
                _fail(
                    self.ctx,
                    f"The agent stopped without finishing the task (left {self.state.short}).",
                )
            return
        logger.error(
            "hosted executor raised; failing the task",
            exc_info=(type(error), error, error.__traceback__),
            extra=self.extra,
        )
        if not self.ctx.finished:
            _fail(self.ctx, f"The agent failed: {type(error).__name__}.")

    # --- events to services ---
    def _write(self, event: Any) -> None:
        try:
            if isinstance(event, a2a_pb2.Message):
                self._message(event)
                return
            if isinstance(event, a2a_pb2.Task):
                self._ids(event.id, event.context_id)
                self._task(event)
            elif isinstance(event, a2a_pb2.TaskStatusUpdateEvent):
                self._ids(event.task_id, event.context_id)
                self._status(event)
            elif isinstance(event, a2a_pb2.TaskArtifactUpdateEvent):
                self._ids(event.task_id, event.context_id)
                self._artifact(event)
            else:
                raise _Refused(f"{type(event).__name__} is not an A2A event")
            self.wrote_task_event = True
        except InvalidPayload as exc:
            raise _Refused(str(exc)) from exc
        except IllegalTransition as exc:
            if exc.terminal and not self.ctx.finished:
                raise
            raise _Refused(str(exc)) from exc
        except TaskTerminal as exc:
            if not self.ctx.finished:
                raise
            raise _Refused(str(exc)) from exc

    def _ids(self, task_id: str, context_id: str) -> None:
        if task_id != self.task_id:
            raise _Refused(f"an event for task {task_id[:80]!r}, not this run's")
        if context_id and context_id != self.request.context_id:
            raise _Refused(f"an event for context {context_id[:80]!r}, not the task's")

    def _state(self, value: int) -> TaskState:
        try:
            return TaskState(a2a_pb2.TaskState.Name(value))
        except ValueError:
            raise _Refused(f"no such task state: {value}") from None

    def _moved(self, task: Task) -> None:
        self.state = task.task_state
        if self.state in TERMINAL_STATES:
            self.ctx.finished = True

    def _message(self, event: a2a_pb2.Message) -> None:
        if self.wrote_task_event:
            raise _Refused("a Message after task events (answer with one or the other)")
        if event.task_id and event.task_id != self.task_id:
            raise _Refused(f"a message for task {event.task_id[:80]!r}, not this run's")
        try:
            self._moved(services.task_reply_with_message(task_id=self.task_id, message=event))
        except InvalidPayload as exc:
            raise _Refused(str(exc)) from exc
        except (IllegalTransition, TaskTerminal) as exc:
            if self.ctx.finished or not getattr(exc, "terminal", True):
                raise _Refused(str(exc)) from exc
            raise

    def _status(self, event: a2a_pb2.TaskStatusUpdateEvent) -> None:
        state = self._state(event.status.state)
        message = event.status.message if event.status.HasField("message") else None
        if state == self.state == TaskState.SUBMITTED and message is None:
            return  # TaskUpdater.submit() on the task the platform opened: nothing to say
        self._moved(services.task_transition(task_id=self.task_id, to_state=state, message=message))

    def _task(self, event: a2a_pb2.Task) -> None:
        state = self._state(event.status.state)
        if state != self.state:
            message = event.status.message if event.status.HasField("message") else None
            self._moved(
                services.task_transition(task_id=self.task_id, to_state=state, message=message)
            )
        known = {a.artifact_id for a in self.request.current_task.artifacts}
        for artifact in event.artifacts:
            if artifact.artifact_id not in known:
                services.task_add_artifact(task_id=self.task_id, artifact=artifact, last_chunk=True)

    def _artifact(self, event: a2a_pb2.TaskArtifactUpdateEvent) -> None:
        if event.append and self.ctx.artifact_chunks(event.artifact.artifact_id)[0] == 0:
            raise _Refused(f"an append to unknown artifact {event.artifact.artifact_id[:80]!r}")
        services.task_add_artifact(
            task_id=self.task_id,
            artifact=event.artifact,
            append=event.append,
            last_chunk=event.last_chunk,
        )
