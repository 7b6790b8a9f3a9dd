"""SendStreamingMessage and SubscribeToTask, binding-independent (the bindings frame them as
SSE through binding.open_stream and sse.py).

Opening a stream is ordinary operation work in short ORM calls — parse, authorize, write
(SendStreamingMessage goes through the same `writes.accept_message` as SendMessage),
snapshot — and any error there is an ordinary error response. The stream itself follows the
task's TaskEvent rows after a `(task_id, seq)` cursor: arm a wake-up on the per-process event
hub, read the rows after the cursor, and only then wait, so nothing committed in between is
missed (whichever instance or worker committed it). While it waits a stream holds no database
connection and no thread. Concurrent readers of one task share one query per wake-up.

End of stream (spec §3.1.2, §3.1.6, §11.7; docs/decisions.md "Streaming (SSE) and the event
hub"): right after the event that makes the task terminal or interrupted. A subscription
opened on an interrupted task therefore stays open until the task's next terminal or
interrupted event. `message` events are history entries and never streamed (the stream shape
has no place for them).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from a2a.types import a2a_pb2
from django.conf import settings

from a2a_platform.lib.orm import run_orm
from a2a_platform.protocol.context import Ctx
from a2a_platform.protocol.errors import (
    INTERNAL,
    TASK_NOT_FOUND,
    UNAVAILABLE,
    UNSUPPORTED_OPERATION,
    ProtocolError,
    invalid_params,
    orm,
)
from a2a_platform.protocol.params import Params, parse_request
from a2a_platform.protocol.sse import KEEPALIVE
from a2a_platform.protocol.visibility import snapshot, visible_task
from a2a_platform.protocol.writes import accept_message
from tasks.event_hub import EventHub, get_hub
from tasks.models import EventKind, Task
from tasks.selectors import consistent_reads, task_answered_with_message, task_event_rows
from tasks.states import SETTLED_STATES, TERMINAL_STATES, TERMINAL_VALUES

# Rows read per query; a stream that finds a full page reads again before waiting.
PAGE = 500
MAX_SEQ = 2**31 - 1


@dataclass(frozen=True)
class StreamEvent:
    """One StreamResponse (ProtoJSON) and the task seq it brings the client to (SSE `id`)."""

    seq: int
    response: dict[str, Any]
    last: bool = False  # the stream ends after it (v0.3: `final: true` on a status update)


@dataclass
class TaskStream:
    """An opened stream: `events` yields StreamEvent items and sse.KEEPALIVE."""

    task_id: str
    events: AsyncIterator[Any] = field(repr=False)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self.events

    async def aclose(self) -> None:
        await self.events.aclose()


# --- Following a task ------------------------------------------------------------------------

# Reads in flight per event loop, by (task, cursor): (hub generation at start, task).
_reads: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict] = weakref.WeakKeyDictionary()


class _Follower:
    """One stream's interest in one task on the hub (re-armed after each wake-up)."""

    def __init__(self, hub: EventHub, task_id: str) -> None:
        self.hub = hub
        self.task_id = task_id
        self.fut: asyncio.Future | None = None
        self.generation = 0

    def arm(self) -> None:
        if self.fut is None or self.fut.done():
            self.fut = self.hub.subscribe(self.task_id)
            self.generation = self.hub.generation

    async def wait(self, timeout: float) -> bool:
        """True when woken (possibly spuriously), False after `timeout`."""
        assert self.fut is not None
        done, _ = await asyncio.wait({self.fut}, timeout=timeout)
        return bool(done)

    def close(self) -> None:
        if self.fut is not None:
            self.hub.unsubscribe(self.task_id, self.fut)
            self.fut = None


def _read_rows(task_id: str, after: int) -> list[tuple[int, str, dict]]:
    return task_event_rows(task_id, after=after, limit=PAGE)


async def _events_after(follower: _Follower, after: int) -> list[tuple]:
    """The task's event rows after `after`, sharing a read in flight for the same cursor when
    no wake-up reached the hub between that read's start and the caller's arming: whatever
    that read cannot see was committed after it began, so its wake-up arrives after the
    caller armed and wakes it. 100 streams of one task cost one query per wake-up, not 100.
    The rows are shared: never mutate them."""
    loop = asyncio.get_running_loop()
    inflight = _reads.get(loop)
    if inflight is None:
        inflight = _reads[loop] = {}
    task_id = follower.task_id
    key = (task_id, after)
    hit = inflight.get(key)
    if hit is not None and hit[0] >= follower.generation:
        return await asyncio.shield(hit[1])
    read = loop.create_task(run_orm(lambda: _read_rows(task_id, after)))
    inflight[key] = (follower.hub.generation, read)

    def forget(done: asyncio.Task) -> None:
        if inflight.get(key, (None, None))[1] is done:
            del inflight[key]
        if not done.cancelled():
            done.exception()  # retrieved: every awaiting stream got it

    read.add_done_callback(forget)
    return await asyncio.shield(read)


_SETTLED = frozenset(s.value for s in SETTLED_STATES)
_TERMINAL = frozenset(TERMINAL_VALUES)


def _state(response: dict) -> str | None:
    return response.get("statusUpdate", {}).get("status", {}).get("state")


def _settles(kind: str, response: dict) -> bool:
    return kind == EventKind.STATUS and _state(response) in _SETTLED


def _is_terminal(response: dict) -> bool:
    return _state(response) in _TERMINAL


async def _answered_with_message(task_id: str) -> bool:
    return await run_orm(lambda: task_answered_with_message(task_id))


async def _follow(
    follower: _Follower,
    cursor: int,
    *,
    lead: list[StreamEvent] | None = None,
    deferred: StreamEvent | None = None,
    end_seq: int | None = None,
) -> AsyncIterator[Any]:
    """Yield `lead`, then the task's streamable events after `cursor` until one ends the stream.

    `deferred`: SendStreamingMessage's Task snapshot, kept back until the agent's first move
    after the write — if that move is a direct Message reply, the stream is that one Message
    (spec §3.1.2: one `message`, or a `task` then updates). `end_seq`: the task was terminal
    when the stream opened; nothing comes after that seq.
    """
    task_id = follower.task_id
    keepalive = float(settings.A2A_SSE_KEEPALIVE_SECONDS)
    try:
        for event in lead or ():
            yield event
            if event.last:
                return
        while True:
            if end_seq is not None and cursor >= end_seq:
                return
            follower.arm()
            rows = await _events_after(follower, cursor)
            if not rows and end_seq is not None:
                # A finished task's events are all written; missing ones were purged.
                raise _not_retained(task_id, cursor)
            for seq, kind, response in rows:
                if seq != cursor + 1:
                    raise _not_retained(task_id, cursor)
                cursor = seq
                if kind == EventKind.MESSAGE:
                    continue
                closes = _settles(kind, response)
                if deferred is not None:
                    if closes and _is_terminal(response) and await _answered_with_message(task_id):
                        message = response["statusUpdate"]["status"].get("message")
                        if message is not None:
                            yield StreamEvent(seq, {"message": message}, last=True)
                            return
                    yield deferred
                    deferred = None
                yield StreamEvent(seq, response, last=closes)
                if closes:
                    return
            if len(rows) >= PAGE:
                continue
            while not await follower.wait(keepalive):
                yield KEEPALIVE  # and wait on: a quiet task costs no query
    finally:
        follower.close()


def _not_retained(task_id: str, cursor: int) -> ProtocolError:
    return ProtocolError(
        INTERNAL,
        f"the events after {cursor} are no longer retained; read the task with GetTask",
        metadata={"taskId": task_id, "lastEventId": str(cursor)},
    )


# --- Opening ---------------------------------------------------------------------------------


def parse_last_event_id(value: str | None) -> int | None:
    """The `Last-Event-ID` header: a task seq this server sent, or absent."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if not text.isdigit() or int(text) > MAX_SEQ:
        raise invalid_params("Last-Event-ID", "must be the id of an event of this stream")
    return int(text)


def _task_key(task_id: str) -> str:
    """The canonical form the hub is woken with (NOTIFY carries `str(task.id)`)."""
    try:
        return str(uuid.UUID(task_id))
    except (ValueError, TypeError, AttributeError):
        raise ProtocolError(TASK_NOT_FOUND, metadata={"taskId": str(task_id)[:100]}) from None


async def _streaming_hub(ctx: Ctx) -> EventHub:
    """The connected hub, or the refusal: switched off for good by the operator
    (UnsupportedOperation, the card says `streaming: false`), or retryable while this
    instance's event fan-out is down (503 + Retry-After)."""
    if not ctx.agent.streaming_enabled:
        raise ProtocolError(UNSUPPORTED_OPERATION, "this agent does not offer streaming")
    hub = get_hub()
    if not hub.connected and not await hub.start(timeout=2.0):
        raise ProtocolError(
            UNAVAILABLE,
            "this instance's event fan-out is not connected; retry shortly",
            reason="STREAMING_UNAVAILABLE",
            retry_after=5,
        )
    return hub


@dataclass(frozen=True)
class _Opened:
    cursor: int
    lead: list[StreamEvent]
    end_seq: int | None


def _resume(task: Task, resume_after: int) -> _Opened:
    if resume_after > task.last_seq:
        raise invalid_params("Last-Event-ID", f"is beyond this task's last event ({task.last_seq})")
    end = task.last_seq if task.task_state in TERMINAL_STATES else None
    return _Opened(resume_after, [], end)


def _open_subscription(ctx: Ctx, task_id: str, resume_after: int | None) -> _Opened:
    with consistent_reads():
        task = visible_task(ctx, task_id)
        if resume_after is not None:
            # Replayed after the client's cursor even if the task has finished since.
            return _resume(task, resume_after)
        if task.task_state in TERMINAL_STATES:
            raise ProtocolError(
                UNSUPPORTED_OPERATION,
                f"task is in terminal state {task.task_state.short}; there is nothing to "
                "subscribe to (read it with GetTask)",
                metadata={"taskId": task_id, "state": task.state},
            )
        first = StreamEvent(task.last_seq, {"task": snapshot(task, history_length=None)})
        return _Opened(task.last_seq, [first], None)


def _open_replayed_send(
    ctx: Ctx, task_id: str, resume_after: int | None, history_length: int | None
) -> _Opened:
    """An idempotent retry of SendStreamingMessage (nothing was written): follow the same
    task, from the client's cursor or from a fresh snapshot; a finished task is its final
    shape (the Message reply, or the Task) and the end of the stream."""
    with consistent_reads():
        task = visible_task(ctx, task_id)
        if resume_after is not None:
            return _resume(task, resume_after)
        done = task.task_state in TERMINAL_STATES
        if done and task.answered_with_message and task.status_message:
            reply = StreamEvent(task.last_seq, {"message": task.status_message}, last=True)
            return _Opened(task.last_seq, [reply], None)
        snap = snapshot(task, history_length=history_length)
        return _Opened(task.last_seq, [StreamEvent(task.last_seq, {"task": snap}, last=done)], None)


async def subscribe_to_task(
    ctx: Ctx, params: Params, *, resume_after: int | None = None
) -> TaskStream:
    req = parse_request(params, a2a_pb2.SubscribeToTaskRequest)
    if not req.id:
        raise invalid_params("id", "is required")
    hub = await _streaming_hub(ctx)
    task_id = _task_key(req.id)
    follower = _Follower(hub, task_id)
    follower.arm()  # before the snapshot: nothing committed after it can be missed
    try:
        opened = await orm(lambda: _open_subscription(ctx, task_id, resume_after))
    except BaseException:
        follower.close()
        raise
    events = _follow(follower, opened.cursor, lead=opened.lead, end_seq=opened.end_seq)
    return TaskStream(task_id, events)


async def send_streaming_message(
    ctx: Ctx, params: Params, *, resume_after: int | None = None
) -> TaskStream:
    """SendMessage's write, then the task's stream. `Last-Event-ID` counts only on an
    idempotent retry (same caller, same messageId, same request): a new message has no past."""
    hub = await _streaming_hub(ctx)  # before writing: a refused stream writes nothing
    accepted = await accept_message(ctx, params, render_snapshot=True)
    task_id = str(accepted.result.task.pk)
    follower = _Follower(hub, task_id)
    follower.arm()
    if accepted.result.replayed:
        try:
            opened = await orm(
                lambda: _open_replayed_send(ctx, task_id, resume_after, accepted.history_length)
            )
        except BaseException:
            follower.close()
            raise
        events = _follow(follower, opened.cursor, lead=opened.lead, end_seq=opened.end_seq)
        return TaskStream(task_id, events)
    written = accepted.result.task.last_seq
    deferred = StreamEvent(written, {"task": accepted.snapshot})
    return TaskStream(task_id, _follow(follower, written, deferred=deferred))


OPEN = {
    "SendStreamingMessage": send_streaming_message,
    "SubscribeToTask": subscribe_to_task,
}
"""The streaming operations (each returns a TaskStream); routes.METHODS joins them with
operations.UNARY."""
