"""Hosted executors: an a2a-sdk `AgentExecutor` named `python:<module>:<attribute>` (issue 45;
agents/executor_spec.py parses the name). What one run needs, on the threads that touch the
database; tasks/executors/host.py runs them on the worker's event loop.

`load(spec)` imports and constructs the executor once per process (`load_check`: the same, as
the one-line reason a worker reports for readiness). `request_context(task)` builds the
`RequestContext` as the SDK's server does: the triggering user message (with the request's
metadata), `task_id`, `context_id`, the stored task with its history as `current_task`, the
caller in `call_context`. An `EventWriter` writes a run's events through the lifecycle
services, in order, a burst of updates in one transaction (`write_all`):

    TaskStatusUpdateEvent    a transition, with its status message (the state machine checks it)
    TaskArtifactUpdateEvent  an artifact, or a chunk of one (`append`, `lastChunk`)
    Message                  a direct answer (services.task_reply_with_message: SendMessage
                             returns `{"message": …}`); only as the run's first event
    Task                     its state, when it differs from the stored one; its artifacts
                             the store has not

An event that breaks the lifecycle (another task's id, a move the state machine refuses, an
append to an unknown artifact, a payload the services refuse) raises `Refused`: the host
fails the task and stops `execute()`.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any

from a2a.auth.user import User
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.types import a2a_pb2

from agents.executor_spec import HostedSpec, hosted_spec
from tasks import selectors, services, wire
from tasks.errors import InvalidPayload, TaskTerminal
from tasks.executors.base import ExecutorContext
from tasks.models import MessageRole, Task
from tasks.state_machine import IllegalTransition
from tasks.states import TERMINAL_STATES, TaskState
from tasks.task_store.base import Snapshot

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


def loaded(value: str) -> bool:
    """Whether this process has loaded the executor `value` names (`load` would not import)."""
    spec = hosted_spec(value)
    return spec is not None and spec in _executors


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


def request_context(task: Task, snapshot: Snapshot | None = None) -> RequestContext:
    """The RequestContext of a run of `task` (its agent loaded), as the SDK's server builds it
    for a message to a stored task: the latest user message, the task as `current_task` (its
    whole history and artifacts), from `snapshot` when the caller read it (a batch of
    claims: selectors.task_snapshots_for_owner), else read here."""
    if snapshot is None:
        history, artifacts = selectors.task_history(task, None), selectors.task_artifacts(task)
    else:
        _, history, artifacts = snapshot
    for row in history:
        row.task = task  # stored_message_json reads the task's context id
    pb_task = wire.parse_dict(
        wire.task_json(task, history=history, artifacts=artifacts), a2a_pb2.Task
    )
    users = [row for row in history if row.role == MessageRole.USER]
    request = None
    if users:
        # The request's metadata as the task stored it from its SendMessage; the rest of its
        # configuration is the platform's (return, history length, push: docs/agents.md).
        sent = {"message": wire.stored_message_json(users[-1]), "metadata": task.metadata or {}}
        request = wire.parse_dict(sent, a2a_pb2.SendMessageRequest)
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


# --- events to services (on a writer thread) ---------------------------------------------

# The events `EventWriter.write_all` writes several of in one transaction.
UPDATES = (a2a_pb2.TaskStatusUpdateEvent, a2a_pb2.TaskArtifactUpdateEvent)


class Refused(Exception):
    """An event that breaks the task's lifecycle: refused, and the task fails."""


def fail(ctx: ExecutorContext, text: str) -> None:
    """End the run's task FAILED with `text` (a finished task is left as it is)."""
    with contextlib.suppress(TaskTerminal, IllegalTransition):
        services.task_transition(task_id=ctx.task_id, to_state=TaskState.FAILED, message=text)
    ctx.finished = True


class EventWriter:
    """A run's events written through the lifecycle services, one at a time, in order.

    `write` raises Refused for an event that breaks the lifecycle, and what the services
    raised for a task finished by someone else (TaskTerminal, a terminal IllegalTransition:
    a cancel) or a database outage."""

    def __init__(self, ctx: ExecutorContext, request: RequestContext, state: TaskState) -> None:
        self.ctx = ctx
        self.task_id = ctx.task_id
        self.context_id = request.context_id
        self.state = state
        self.stored_artifacts = {a.artifact_id for a in request.current_task.artifacts}
        self.wrote_task_event = False

    def write_all(self, events: list[Any]) -> None:
        """Write `events` in order. Status and artifact updates go in one transaction
        (services.task_write_updates: one statement for a start, an artifact and the end);
        if one is refused, nothing of them is kept and they are written again one at a time,
        so those before it are written and it raises as it would alone."""
        if all(isinstance(e, UPDATES) for e in events):
            before = self.checkpoint()
            try:
                self.write_together(events)
                return
            except Exception:
                self.restore(before)
        for event in events:
            self.write(event)

    def write_together(self, events: list[Any]) -> None:
        """Status and artifact updates in the caller's transaction, without a savepoint: an
        error rolls the caller's whole transaction back (`checkpoint` first, `restore` then;
        the host's batch of runs' writes: tasks/executors/host.py)."""
        updates = [u for u in (self._update(e) for e in events) if u is not None]
        if updates:
            self._moved(
                services.task_write_updates(task_id=self.task_id, updates=updates, savepoint=False)
            )
        self.wrote_task_event = True

    def checkpoint(self) -> tuple:
        """What a write moves on in memory, to put back when its transaction rolls back."""
        artifacts = set(self.stored_artifacts)
        return (self.state, self.wrote_task_event, artifacts, self.ctx.finished)

    def restore(self, checkpoint: tuple) -> None:
        self.state, self.wrote_task_event, self.stored_artifacts, self.ctx.finished = checkpoint

    def _update(self, event: Any) -> services.StatusUpdate | services.ArtifactUpdate | None:
        """The update an event asks for, checked as `write` checks it (None: nothing to
        write); the state it moves to and the artifact it adds are taken as written."""
        self._ids(event.task_id, event.context_id)
        if isinstance(event, a2a_pb2.TaskArtifactUpdateEvent):
            artifact_id = self._known_artifact(event)
            self.stored_artifacts.add(artifact_id)
            return services.ArtifactUpdate(event.artifact, event.append, event.last_chunk)
        state = self._state(event.status.state)
        message = event.status.message if event.status.HasField("message") else None
        if state == self.state == TaskState.SUBMITTED and message is None:
            return None
        self.state = state
        return services.StatusUpdate(state, message)

    def write(self, event: Any) -> None:
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
                raise Refused(f"{type(event).__name__} is not an A2A event")
            self.wrote_task_event = True
        except InvalidPayload as exc:
            raise Refused(str(exc)) from exc
        except (IllegalTransition, TaskTerminal) as exc:
            # Finished by someone else (a cancel) is the caller's to handle; a move the state
            # machine refuses on a live task, or anything after the run's own end, is refused.
            if getattr(exc, "terminal", True) and not self.ctx.finished:
                raise
            raise Refused(str(exc)) from exc

    def _ids(self, task_id: str, context_id: str) -> None:
        if task_id != self.task_id:
            raise Refused(f"an event for task {task_id[:80]!r}, not this run's")
        if context_id and context_id != self.context_id:
            raise Refused(f"an event for context {context_id[:80]!r}, not the task's")

    def _state(self, value: int) -> TaskState:
        try:
            return TaskState(a2a_pb2.TaskState.Name(value))
        except ValueError:
            raise Refused(f"no such task state: {value}") from None

    def _moved(self, task: Task) -> None:
        self.state = task.task_state
        if self.state in TERMINAL_STATES:
            self.ctx.finished = True

    def _message(self, event: a2a_pb2.Message) -> None:
        if self.wrote_task_event:
            raise Refused("a Message after task events (answer with one or the other)")
        if event.task_id and event.task_id != self.task_id:
            raise Refused(f"a message for task {event.task_id[:80]!r}, not this run's")
        self._moved(services.task_reply_with_message(task_id=self.task_id, message=event))

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
        for artifact in event.artifacts:
            if artifact.artifact_id not in self.stored_artifacts:
                services.task_add_artifact(task_id=self.task_id, artifact=artifact, last_chunk=True)
                self.stored_artifacts.add(artifact.artifact_id)

    def _known_artifact(self, event: a2a_pb2.TaskArtifactUpdateEvent) -> str:
        """The event's artifact id; Refused for an append to an artifact the task has not
        (`current_task`'s and those this run added)."""
        artifact_id = event.artifact.artifact_id
        if event.append and artifact_id not in self.stored_artifacts:
            raise Refused(f"an append to unknown artifact {artifact_id[:80]!r}")
        return artifact_id

    def _artifact(self, event: a2a_pb2.TaskArtifactUpdateEvent) -> None:
        artifact_id = self._known_artifact(event)
        services.task_add_artifact(
            task_id=self.task_id,
            artifact=event.artifact,
            append=event.append,
            last_chunk=event.last_chunk,
        )
        self.stored_artifacts.add(artifact_id)
