"""Lifecycle services: the only code that changes a task.

Each public function is ONE transaction: it locks the task row, validates the change against
the pure state machine, writes the task, appends its TaskEvent (gap-free `seq`), runs the
in-transaction event hooks (the webhook outbox) and queues one NOTIFY per task for commit.
One exception to the lock: `task_answer` given the row a quick claim read writes only if the
task has not moved since (task_store.append_events), and otherwise locks it and writes again.
Jobs are enqueued only after commit. The outermost ones, `task_send` and `task_cancel`, are
durable (a caller's transaction around them raises); the others are also called inside
executors' and other services' transactions, whose commit then carries their NOTIFY and jobs.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from a2a.types import a2a_pb2
from django.db import transaction
from django.utils import timezone

from a2a_platform.lib.sql import new_row
from tasks import wire
from tasks.dispatch import dispatch_announce_new, dispatch_open
from tasks.errors import IllegalTransition, InvalidPayload, TaskNotFound, TaskTerminal
from tasks.hooks import run_event_hooks
from tasks.models import (
    Artifact,
    EventKind,
    ExecutorDispatch,
    Message,
    MessageReceipt,
    Task,
    TaskEvent,
)
from tasks.state_machine import check_transition, next_status_timestamp
from tasks.states import TERMINAL_STATES, TaskState
from tasks.task_store import NewTask, get_task_store

logger = logging.getLogger(__name__)
# One line per task and step (created, claimed, moved, answered) goes to this logger, at
# WARNING unless A2A_TASK_LOG_LEVEL says otherwise (settings.LOGGING): the task's events are
# its durable record.
lifecycle_log = logging.getLogger("tasks.lifecycle")

MessageInput = a2a_pb2.Message | dict[str, Any]


def lock_task(task_id: object) -> Task:
    """The task row (with its agent), locked FOR UPDATE until the surrounding transaction
    ends. TaskNotFound for an unknown or malformed id."""
    task = get_task_store().lock(_task_pk(task_id))
    if task is None:
        raise TaskNotFound(task_id)
    return task


def task_extension_metadata_set(*, task: Task, uri: str, value: dict[str, Any] | None) -> None:
    """Set (or, with None, remove) the entry `uri` of the task's metadata: an extension's
    annotation, readable through GetTask, ListTasks and a stream's first Task (no event is
    appended: the state did not change). Inside the caller's transaction, the task locked
    (`lock_task`)."""
    metadata = dict(task.metadata or {})
    if value is None:
        metadata.pop(uri, None)
    else:
        metadata[uri] = value
    task.metadata = metadata
    Task.objects.filter(pk=task.pk).update(metadata=metadata)


def _task_pk(task_id: object) -> uuid.UUID:
    if isinstance(task_id, uuid.UUID):
        return task_id
    try:
        return uuid.UUID(str(task_id))
    except ValueError:
        raise TaskNotFound(task_id) from None


def _as_message(message: MessageInput, field: str = "message") -> a2a_pb2.Message:
    if isinstance(message, a2a_pb2.Message):
        return wire.check_message(message, field=field)
    return wire.parse_message(message, field=field)


@dataclass
class _PendingEvents:
    """A transaction's new events, and the artifact one of them adds, pending, to be written
    together at its end (`_write_events`)."""

    events: list[TaskEvent] = field(default_factory=list)
    artifact: Artifact | None = None


def _append_event(
    task: Task,
    kind: str,
    payload: dict[str, Any],
    *,
    pending: _PendingEvents | None = None,
    artifact: Artifact | None = None,
) -> TaskEvent:
    """The next event of a locked task (with `artifact`, the artifact row it adds); also
    writes the task's lifecycle fields (task_store.LIFECYCLE_FIELDS) as they are now, and
    queues the hub's NOTIFY. With `pending`, the event (and artifact) is numbered and added
    to it instead, for `_write_events` to write with the others of the same transaction in one
    statement."""
    task.last_seq += 1
    event = new_row(
        TaskEvent,
        task=task,
        seq=task.last_seq,
        kind=kind,
        payload=payload,
        created_at=timezone.now(),
    )
    if pending is None:
        _write_locked(task, _PendingEvents([event], artifact))
    else:
        pending.events.append(event)
        if artifact is not None:
            pending.artifact = artifact
    return event


def _write_events(task: Task, pending: _PendingEvents) -> bool:
    """Write a task's new events together, with the artifact one adds and its lifecycle fields
    as they are now (one statement on PostgreSQL), then run the event hooks on them together.
    False: the task moved since `task` was read, and nothing was written (only a task read
    without its lock can have moved: `task_answer`'s `seen`)."""
    if not pending.events:
        return True
    if not get_task_store().append_events(task, pending.events, pending.artifact):
        return False
    run_event_hooks(task, pending.events)
    return True


def _write_locked(task: Task, pending: _PendingEvents) -> None:
    """`_write_events` for a task locked by this transaction (`lock_task`): it cannot move."""
    if not _write_events(task, pending):
        raise RuntimeError(f"task {task.id} moved while this transaction had it locked")


def _message_row(task: Task, msg: a2a_pb2.Message) -> Message:
    data = wire.to_json(msg)
    return new_row(
        Message,
        task=task,
        message_id=msg.message_id,
        role=a2a_pb2.Role.Name(msg.role),
        parts=data["parts"],
        metadata=data.get("metadata", {}),
        extensions=list(msg.extensions),
        reference_task_ids=list(msg.reference_task_ids),
    )


def _store_message(task: Task, msg: a2a_pb2.Message) -> Message:
    message = _message_row(task, msg)
    message.save(force_insert=True)
    return message


def _agent_status_message(
    task: Task, message: MessageInput | str | None, *, direct: bool = False
) -> dict | None:
    """An agent status message with the task's ids filled in, as ProtoJSON. A `direct`
    answer (a Message instead of a task) keeps the task id its agent gave it, none when it
    gave none: the client asked no task of it (spec §3.1.2; the SDK's server answers so)."""
    if message is None:
        return None
    if isinstance(message, str):
        message = {
            "messageId": str(uuid.uuid4()),
            "role": "ROLE_AGENT",
            "parts": [{"text": message}],
        }
    msg = _as_message(message, "status.message")
    if msg.role != a2a_pb2.ROLE_AGENT:
        raise InvalidPayload("status.message.role", "a status message comes from the agent")
    if not direct or msg.task_id:
        msg.task_id = str(task.id)
    msg.context_id = task.context_id
    return wire.to_json(msg)


def _set_status(
    task: Task,
    to_state: TaskState,
    status_message: dict | None,
    *,
    pending: _PendingEvents | None = None,
) -> None:
    check_transition(task.task_state, to_state)
    task.state = to_state.value
    task.status_timestamp = next_status_timestamp(task.status_timestamp, timezone.now())
    task.status_message = status_message
    # A terminal state closes the task's dispatches with its events' write (append_events).
    _append_event(task, EventKind.STATUS, wire.status_update_json(task), pending=pending)


def _new_task(
    *,
    agent: Any,
    owner: str,
    msg: a2a_pb2.Message,
    context_id: str | None,
    metadata: dict | None,
    card_version_id: int | None = None,
    task_pk: uuid.UUID | None = None,
    receipt: MessageReceipt | None = None,
    trace: tuple[str, str] = ("", ""),
) -> NewTask:
    """The rows of a new task (SendMessage's hot path), none written yet: Task (last_seq
    already 1), its first Message, TaskEvent seq 1 and the executor dispatch, written together
    by task_store.open_tasks, after the idempotency `receipt` in the same statement when there
    is one. No NOTIFY: nobody can be waiting on a task id not yet returned. No event hooks
    either: nothing can have subscribed to a task that does not exist yet (a push config
    registered with it writes its own snapshot of the task). `trace`: the task's W3C
    (traceparent, tracestate), a2a_platform/lib/tracing.py's `new_task_trace`."""
    if msg.role != a2a_pb2.ROLE_USER:
        raise InvalidPayload("message.role", "a client message must have role ROLE_USER")
    if msg.context_id and context_id and msg.context_id != context_id:
        raise InvalidPayload("message.contextId", "does not match the request's contextId")
    ctx = msg.context_id or context_id or str(uuid.uuid4())
    now = timezone.now()
    task = new_row(
        Task,
        id=task_pk or uuid.uuid4(),
        agent=agent,
        owner=owner,
        context_id=ctx,
        state=TaskState.SUBMITTED.value,
        status_timestamp=next_status_timestamp(None, now),
        metadata=metadata or {},
        last_seq=1,
        card_version_id=card_version_id,
        traceparent=trace[0],
        tracestate=trace[1],
    )
    event = new_row(
        TaskEvent,
        task=task,
        seq=1,
        kind=EventKind.STATUS,
        payload=wire.status_update_json(task),
        created_at=now,
    )
    dispatch = new_row(ExecutorDispatch, task=task, not_before=now, progress={}, enqueues=1)
    return NewTask(task, _message_row(task, msg), event, dispatch, receipt)


def _open_task(**rows: Any) -> tuple[Task, Message] | None:
    """Inside a transaction: a new task's rows (`_new_task`'s arguments), written in one
    statement; None when its receipt was taken (a retry: nothing was written)."""
    new = _new_task(**rows)
    (opened,) = get_task_store().open_tasks([new])
    if not opened:
        return None
    dispatch_announce_new([new.dispatch])
    return new.task, new.message


def task_transition(
    *,
    task_id: object,
    to_state: TaskState | str,
    message: MessageInput | str | None = None,
) -> Task:
    """Move a task to `to_state`, with an optional agent status message.

    Raises IllegalTransition (the table forbids it; `.terminal` when the task finished) and
    TaskNotFound. Side effects: TaskEvent (statusUpdate), webhook outbox rows via hooks, a
    NOTIFY at commit; a terminal state closes the task's active executor dispatch.
    """
    to_state = TaskState(to_state)
    with transaction.atomic():
        task = lock_task(task_id)
        _set_status(task, to_state, _agent_status_message(task, message))
    lifecycle_log.info(
        "task transition",
        extra={"task_id": str(task.id), "state": task.state, "seq": task.last_seq},
    )
    return task


def task_reply_with_message(*, task_id: object, message: MessageInput | str) -> Task:
    """The agent answers with a direct Message: it joins the history and the task completes.

    SendMessage then returns `{"message": ...}` instead of the task (spec §3.1.1).
    """
    with transaction.atomic():
        task = lock_task(task_id)
        status_message = _agent_status_message(task, message, direct=True)
        _store_message(task, wire.parse_message(status_message))
        task.answered_with_message = True
        _set_status(task, TaskState.COMPLETED, status_message)
    return task


def task_add_artifact(
    *,
    task_id: object,
    artifact: dict[str, Any] | a2a_pb2.Artifact,
    append: bool = False,
    last_chunk: bool = False,
) -> Task:
    """Add an artifact, or a chunk of one (`append` extends the parts of the same artifactId).

    A new artifact with an existing id replaces it (spec §4.1.7). Appending to an artifact
    whose last chunk was seen is refused. Side effects: TaskEvent (artifactUpdate), hooks,
    NOTIFY.
    """
    art, chunk = _parse_artifact(artifact)
    with transaction.atomic():
        task = lock_task(task_id)
        if task.task_state in TERMINAL_STATES:
            raise TaskTerminal(task.id, task.state)
        existing = get_task_store().artifact(task, art.artifact_id)
        _add_artifact(task, art, chunk, existing, append=append, last_chunk=last_chunk)
    return task


def _parse_artifact(
    artifact: dict[str, Any] | a2a_pb2.Artifact,
) -> tuple[a2a_pb2.Artifact, dict[str, Any]]:
    if isinstance(artifact, a2a_pb2.Artifact):
        artifact = wire.to_json(artifact)
    art = wire.parse_artifact(artifact)
    return art, wire.to_json(art)


def _add_artifact(
    task: Task,
    art: a2a_pb2.Artifact,
    chunk: dict[str, Any],
    existing: Artifact | None,
    *,
    append: bool,
    last_chunk: bool,
    pending: _PendingEvents | None = None,
) -> None:
    """The artifact (or chunk) of a locked, non-terminal task, and its event; `existing` is
    the task's stored artifact of that id, if any."""
    if append and existing is not None:
        if existing.complete:
            raise InvalidPayload("artifact", "its last chunk was already added")
        existing.parts = existing.parts + chunk["parts"]
        existing.chunks += 1
        existing.complete = last_chunk
    else:
        existing = existing or new_row(Artifact, task=task, artifact_id=art.artifact_id)
        existing.name = art.name
        existing.description = art.description
        existing.parts = chunk["parts"]
        existing.metadata = chunk.get("metadata", {})
        existing.extensions = list(art.extensions)
        existing.complete = last_chunk
        existing.chunks = 1
    _append_event(
        task,
        EventKind.ARTIFACT,
        wire.artifact_update_json(task, chunk, append=append, last_chunk=last_chunk),
        pending=pending,
        artifact=existing,
    )


@dataclass(frozen=True)
class StatusUpdate:
    """A move, as `task_transition` writes it (`task_write_updates`)."""

    to_state: TaskState | str
    message: MessageInput | str | None = None


@dataclass(frozen=True)
class ArtifactUpdate:
    """An artifact or a chunk of one, as `task_add_artifact` writes it (`task_write_updates`)."""

    artifact: dict[str, Any] | a2a_pb2.Artifact
    append: bool = False
    last_chunk: bool = False


def task_write_updates(
    *,
    task_id: object,
    updates: Sequence[StatusUpdate | ArtifactUpdate],
    savepoint: bool = True,
) -> Task:
    """An executor's updates in turn, each as `task_transition` or `task_add_artifact` writes
    it (the same checks, events and side effects), in one transaction with the task locked
    once: the events written in one statement for each artifact they touch (one for a
    start, an artifact and the end), not one transaction each. All or nothing: an update
    refused raises as it would alone and nothing of the others is written (a hosted run's
    burst of events: tasks/executors/hosted.py). `savepoint=False`: inside a caller's
    transaction, join it without a savepoint of its own (two statements fewer); an error then
    rolls the caller's whole transaction back."""
    with transaction.atomic(savepoint=savepoint):
        task = lock_task(task_id)
        pending = _PendingEvents()
        for update in updates:
            if isinstance(update, StatusUpdate):
                message = _agent_status_message(task, update.message)
                _set_status(task, TaskState(update.to_state), message, pending=pending)
                continue
            if task.task_state in TERMINAL_STATES:
                raise TaskTerminal(task.id, task.state)
            art, chunk = _parse_artifact(update.artifact)
            existing = pending.artifact
            if existing is None or existing.artifact_id != art.artifact_id:
                # One artifact per statement (append_events): another one's events first.
                _write_locked(task, pending)
                pending = _PendingEvents()
                existing = get_task_store().artifact(task, art.artifact_id)
            _add_artifact(
                task,
                art,
                chunk,
                existing,
                append=update.append,
                last_chunk=update.last_chunk,
                pending=pending,
            )
        _write_locked(task, pending)
    lifecycle_log.info(
        "task updated",
        extra={"task_id": str(task.id), "state": task.state, "seq": task.last_seq},
    )
    return task


@dataclass(frozen=True)
class Answer:
    """An executor's whole answer, as `task_answer` takes it (`task_answers`: several)."""

    task_id: object
    artifact: dict[str, Any] | a2a_pb2.Artifact
    to_state: TaskState | str = TaskState.COMPLETED
    message: MessageInput | str | None = None
    seen: Task | None = None


def task_answer(
    *,
    task_id: object,
    artifact: dict[str, Any] | a2a_pb2.Artifact,
    to_state: TaskState | str = TaskState.COMPLETED,
    message: MessageInput | str | None = None,
    seen: Task | None = None,
    savepoint: bool = True,
) -> Task:
    """An executor's whole answer in one transaction, the task locked at most once: WORKING if the
    task is still SUBMITTED, then the artifact (one chunk, its last) unless the task already
    has a complete artifact of that id (a run resumed after a crash: not sent again), then
    `to_state` with an optional agent status message. The same events as task_transition,
    task_add_artifact and task_transition in turn, written in one statement at the end (the
    task row written once); all of them or none commit, so a run killed midway leaves the
    task as it found it.

    `seen`: the task row as the caller read it without locking it (a quick claim's), still
    SUBMITTED. The answer is then built from it and written without taking the lock first,
    if the task has not moved since (task_store.append_events); otherwise, or when `seen`
    refuses the move, it is built and written again the locked way, in the same transaction
    (the missed write wrote nothing). Same outcome either way, one round trip fewer.

    `savepoint=False`: inside a caller's transaction, join it without a savepoint of its own
    (two statements fewer); an error then rolls the caller's whole transaction back.

    Raises TaskTerminal when the task finished meanwhile, IllegalTransition as
    task_transition does, TaskNotFound.
    """
    answer = Answer(task_id, artifact, to_state, message, seen)
    with transaction.atomic(savepoint=savepoint):
        return task_answers([answer])[0]


def task_answers(answers: Sequence[Answer]) -> list[Task]:
    """Several tasks' answers (each as `task_answer` writes it, each task at most once), in
    the caller's transaction, without a savepoint of their own: an error rolls the caller's
    whole transaction back (a batch of quick runs: runner._run_together, which then runs each
    claim again on its own). Those whose `seen` row has not moved are written together, in
    one statement however many (task_store.append_events_together: their rows locked in id
    order, the moved ones' too); each other one then the locked way, in turn, its lock already
    taken. Returns the tasks, in order."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("task_answers() runs inside a transaction")
    steps = []
    for answer in answers:
        to_state = TaskState(answer.to_state)
        art, chunk = _parse_artifact(answer.artifact)
        pending, seen = None, answer.seen
        if seen is not None and seen.task_state == TaskState.SUBMITTED:
            # A refusal read from an unlocked row is not final: the lock decides.
            with contextlib.suppress(IllegalTransition):
                pending = _answer_events(seen, art, chunk, to_state, answer.message)
        steps.append((answer, art, chunk, to_state, pending))
    unlocked = [(a.seen, pending.events, pending.artifact) for a, *_, pending in steps if pending]
    written = get_task_store().append_events_together(unlocked) if unlocked else set()
    tasks = []
    for answer, art, chunk, to_state, pending in steps:
        if pending is not None and answer.seen.pk in written:
            task = answer.seen
            run_event_hooks(task, pending.events)
        else:
            task = lock_task(answer.task_id)
            _write_locked(task, _answer_events(task, art, chunk, to_state, answer.message))
        lifecycle_log.info(
            "task answered",
            extra={"task_id": str(task.id), "state": task.state, "seq": task.last_seq},
        )
        tasks.append(task)
    return tasks


def _answer_events(
    task: Task,
    art: a2a_pb2.Artifact,
    chunk: dict[str, Any],
    to_state: TaskState,
    message: MessageInput | str | None,
) -> _PendingEvents:
    """task_answer's events for `task` as it is (numbered, and its fields moved on, not yet
    written)."""
    if task.task_state in TERMINAL_STATES:
        raise TaskTerminal(task.id, task.state)
    pending = _PendingEvents()
    if task.task_state == TaskState.SUBMITTED:
        # Nothing was answered yet: no artifact of this run can exist.
        _set_status(task, TaskState.WORKING, None, pending=pending)
        done = None
    else:
        done = get_task_store().artifact(task, art.artifact_id)
    if done is None or not done.complete:
        _add_artifact(task, art, chunk, done, append=False, last_chunk=True, pending=pending)
    _set_status(task, to_state, _agent_status_message(task, message), pending=pending)
    return pending


def task_append_message(*, task_id: object, message: MessageInput) -> Task:
    """Append a message to a task's history; a client message continues the task (multi-turn).

    A client message to a terminal task raises TaskTerminal. A client message whose contextId
    differs from the task's is refused (spec §3.4.3); an omitted one is the task's. A client
    message opens an executor dispatch unless one is already active.
    """
    msg = _as_message(message)
    with transaction.atomic():
        task = lock_task(task_id)
        if task.task_state in TERMINAL_STATES:
            raise TaskTerminal(task.id, task.state)
        if msg.context_id and msg.context_id != task.context_id:
            raise InvalidPayload("message.contextId", "does not match the task's contextId")
        msg.context_id = task.context_id
        msg.task_id = str(task.id)
        _store_message(task, msg)
        _append_event(task, EventKind.MESSAGE, {"message": wire.to_json(msg)})
        if msg.role == a2a_pb2.ROLE_USER:
            dispatch_open(task)
    return task


def task_add_agent_message(*, task_id: object, message: MessageInput) -> Task:
    """A worker backend adds a message to a task's history: always the agent's.

    A message whose role names anyone but the agent raises InvalidPayload; an omitted role is
    the agent's. Otherwise as task_append_message (an agent message opens no dispatch).
    """
    if isinstance(message, dict):
        if message.get("role") not in (None, "ROLE_AGENT"):
            raise InvalidPayload("message.role", "a worker adds agent messages (ROLE_AGENT)")
        message = {**message, "role": "ROLE_AGENT"}
    return task_append_message(task_id=task_id, message=message)


def task_cancel(*, task_id: object, reason: str | None = None) -> Task:
    """Cancel a task (best effort for the executor, final for the store).

    A terminal task raises IllegalTransition with `.terminal` (TaskNotCancelable on the wire).
    Outermost (durable): a client's or operator's cancel is never folded into another write.
    """
    with transaction.atomic(durable=True):
        return task_transition(task_id=task_id, to_state=TaskState.CANCELED, message=reason)


@dataclass(frozen=True)
class SendResult:
    task: Task
    created: bool  # a new task was opened (else an existing one was continued)
    replayed: bool  # an idempotent retry: nothing was written
    first_message: Message | None = None  # the new task's history, when created


def _replay(agent: Any, owner: str, message_id: str, request_hash: str) -> SendResult:
    """The answer to a request whose receipt was already claimed: the earlier task."""
    receipt = (
        MessageReceipt.objects.select_related("task")
        .filter(agent=agent, owner=owner, message_id=message_id)
        .get()
    )
    if receipt.request_hash != request_hash:
        raise InvalidPayload(
            "message.messageId", "was already used by this caller with a different request"
        )
    return SendResult(receipt.task, created=False, replayed=True)


@dataclass(frozen=True)
class NewSend:
    """A SendMessage that opens a task with nothing written beside it (`task_send_new`):
    `task_send`'s arguments without `within`, `task_pk` its `new_task_id`."""

    agent: Any
    owner: str
    message: MessageInput
    request_hash: str | None = None
    metadata: dict[str, Any] | None = None
    card_version_id: int | None = None
    task_pk: uuid.UUID | None = None
    trace: tuple[str, str] = ("", "")  # the new task's W3C (traceparent, tracestate)


def task_send_new(*, sends: Sequence[NewSend]) -> list[SendResult | Exception]:
    """SendMessage's write for sends that open a task with nothing written beside it, any
    number at once: their rows in one store call (task_store.open_tasks: one statement on
    PostgreSQL, atomic on its own, no transaction around it) and one announcement of their
    dispatches. Each send's outcome at its position: its SendResult (created; or replayed, as
    `task_send` answers a retry) or the error that refused it alone (a message that does not
    check, a messageId reused with another request). Raises only when the write itself
    fails, and then nothing was written: each send may be tried again alone. A caller's
    transaction around it raises RuntimeError, as around `task_send`.

    Errors found after the write are that send's outcome, never raised: the others' tasks
    are committed, and a retry of them alone would open them twice."""
    outcomes: list[SendResult | Exception | None] = [None] * len(sends)
    news: list[tuple[int, NewTask]] = []
    for i, send in enumerate(sends):
        try:
            msg = _as_message(send.message)
            task_pk = send.task_pk or uuid.uuid4()
            receipt = None
            if send.request_hash:
                receipt = new_row(
                    MessageReceipt,
                    agent=send.agent,
                    owner=send.owner,
                    message_id=msg.message_id,
                    request_hash=send.request_hash,
                    task_id=task_pk,
                )
            new = _new_task(
                agent=send.agent,
                owner=send.owner,
                msg=msg,
                context_id=None,
                metadata=send.metadata,
                card_version_id=send.card_version_id,
                task_pk=task_pk,
                receipt=receipt,
                trace=send.trace,
            )
        except Exception as exc:
            outcomes[i] = exc
        else:
            news.append((i, new))
    with _durable_alone():
        opened = get_task_store().open_tasks([new for _, new in news]) if news else []
    created = []
    for (i, new), written in zip(news, opened, strict=True):
        if written:
            outcomes[i] = SendResult(new.task, True, False, first_message=new.message)
            created.append(new)
            continue
        send = sends[i]
        try:
            outcomes[i] = _replay(send.agent, send.owner, new.message.message_id, send.request_hash)
        except Exception as exc:
            outcomes[i] = exc
    try:
        dispatch_announce_new([new.dispatch for new in created])
    except Exception:  # committed: a sweeper finds a dispatch nobody was told of
        logger.exception("announcing new dispatches failed")
    for new in created:
        extra = {"task_id": str(new.task.id), "agent": new.task.agent.slug}
        lifecycle_log.info("task created", extra=extra)
    return outcomes  # type: ignore[return-value]


def task_send(
    *,
    agent: Any,
    owner: str,
    message: MessageInput,
    request_hash: str | None = None,
    metadata: dict[str, Any] | None = None,
    card_version_id: int | None = None,
    within: Callable[[SendResult], None] | None = None,
    new_task_id: uuid.UUID | None = None,
    trace: tuple[str, str] = ("", ""),
) -> SendResult:
    """SendMessage's write: open a task, or continue the one the message names.

    With `request_hash` (authenticated callers) the request is idempotent on
    (agent, owner, messageId): its receipt is claimed in the same transaction as the task
    change (for a new task in the same statement: task_store.open_tasks; for a follow-up
    first: task_store.claim_receipt). A retry, or a concurrent duplicate once the first
    commits, finds the receipt taken, writes nothing and is answered with the earlier task;
    the same id with a different hash raises InvalidPayload. No lookup precedes the claim:
    retries are rare, sends are not. `within(result)` runs inside the transaction after the
    write (not on a replay): the caller's writes that must commit or fail with it
    (SendMessage's inline push config), without a transaction around this one (durable: an
    outer transaction raises RuntimeError). `new_task_id`: the id a new task gets (chosen by
    a caller that subscribed to it first; ignored for a follow-up). `trace`: a new task's W3C
    (traceparent, tracestate) (a follow-up keeps its task's).
    """
    msg = _as_message(message)
    if within is None and not msg.task_id:
        # A new task with nothing written beside it: one write, atomic on its own.
        (outcome,) = task_send_new(
            sends=[
                NewSend(
                    agent, owner, msg, request_hash, metadata, card_version_id, new_task_id, trace
                )
            ]
        )
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    if msg.role != a2a_pb2.ROLE_USER:
        raise InvalidPayload("message.role", "a client message must have role ROLE_USER")
    first = None
    with transaction.atomic(durable=True):
        if msg.task_id:
            task_pk = _uuid_or_none(msg.task_id)
            if not Task.objects.filter(pk=task_pk, agent=agent, owner=owner).exists():
                raise TaskNotFound(msg.task_id)
        else:
            task_pk = new_task_id or uuid.uuid4()
        receipt = None
        if request_hash:
            receipt = new_row(
                MessageReceipt,
                agent=agent,
                owner=owner,
                message_id=msg.message_id,
                request_hash=request_hash,
                task_id=task_pk,
            )
        if msg.task_id:
            if receipt is not None and not get_task_store().claim_receipt(receipt):
                return _replay(agent, owner, msg.message_id, request_hash)
            task = task_append_message(task_id=task_pk, message=msg)
            created = False
        else:
            # The receipt is claimed in the new task's own statement.
            opened = _open_task(
                agent=agent,
                owner=owner,
                msg=msg,
                context_id=None,
                metadata=metadata,
                card_version_id=card_version_id,
                task_pk=task_pk,
                receipt=receipt,
                trace=trace,
            )
            if opened is None:
                return _replay(agent, owner, msg.message_id, request_hash)
            task, first = opened
            created = True
        result = SendResult(task, created=created, replayed=False, first_message=first)
        if within is not None:
            within(result)
    if created:
        lifecycle_log.info("task created", extra={"task_id": str(task.id), "agent": agent.slug})
    return result


@contextlib.contextmanager
def _durable_alone() -> Iterator[None]:
    """An outermost write that is one store call atomic on its own (it commits as it
    returns), never inside a caller's transaction (its NOTIFY and jobs would move to the
    caller's commit): a surrounding transaction raises RuntimeError, as
    transaction.atomic(durable=True) does."""
    # Django's own durability check (and its allowance for a test case's transaction),
    # free: psycopg sends BEGIN only with a first statement, and no COMMIT without one.
    with transaction.atomic(durable=True):
        pass
    yield


def _uuid_or_none(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None
