"""Server-sent events: framing, keep-alives, disconnects, the per-process cap on open streams,
and closing open streams when the process shuts down.

An open stream is two asyncio tasks (one pumping events, one watching for the client's
`http.disconnect`) and whatever its event source holds between events — never a thread and
never a database connection. Every event carries `id: <task seq>` so a client can resume with
`Last-Event-ID`; comment lines keep idle connections (and the proxies between) alive; on
shutdown each stream gets a `retry:` hint and is ended, so clients reconnect elsewhere and
resume (docs/decisions.md, "Streaming (SSE) and the event hub").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from django.conf import settings

from a2a_platform.protocol.errors import INTERNAL, UNAVAILABLE, ProtocolError, from_domain

logger = logging.getLogger(__name__)

MEDIA_TYPE = "text/event-stream"
RETRY_AFTER_SECONDS = 5
KEEPALIVE_FRAME = b": keep-alive\n\n"
# Refusals about this instance, not the request: 503 + Retry-After on both bindings, so a load
# balancer or client can retry elsewhere.
CAPACITY_REASONS = frozenset({"TOO_MANY_STREAMS", "SHUTTING_DOWN", "STREAMING_UNAVAILABLE"})


class _KeepAlive:
    def __repr__(self) -> str:
        return "KEEPALIVE"


# Yielded by an event source when nothing happened for A2A_SSE_KEEPALIVE_SECONDS.
KEEPALIVE = _KeepAlive()


@dataclass(frozen=True)
class Frame:
    """One SSE event: `data` is one line of JSON; `id` the task seq it brings the client to."""

    data: bytes
    id: int | None = None
    event: str | None = None

    def encode(self) -> bytes:
        out = b""
        if self.event:
            out += b"event: " + self.event.encode() + b"\n"
        if self.id is not None:
            out += b"id: " + str(self.id).encode() + b"\n"
        return out + b"data: " + self.data + b"\n\n"


# --- The per-process registry of open streams ---------------------------------------------


@dataclass(eq=False)
class Slot:
    """A place among this process's open streams, taken before the stream's operation runs
    (so a refused stream writes nothing) and given back when the response ends."""

    pump: asyncio.Task | None = None
    closing: bool = False
    released: bool = False
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            _registry.slots.discard(self)

    def close(self) -> None:
        """Shutdown: end this stream with a retry hint (thread-safe)."""
        self.closing = True
        pump, loop = self.pump, self.loop
        if pump is not None and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(pump.cancel)


class _Registry:
    def __init__(self) -> None:
        self.slots: set[Slot] = set()
        self.shutting_down = False
        self.lock = threading.Lock()


_registry = _Registry()


def admit() -> Slot:
    """A slot for one more stream, or a retryable refusal (503 + Retry-After): past
    A2A_MAX_STREAMS, or once this process is shutting down."""
    with _registry.lock:
        if _registry.shutting_down:
            raise ProtocolError(
                UNAVAILABLE,
                "this instance is shutting down; open the stream on another instance",
                reason="SHUTTING_DOWN",
                retry_after=1,
            )
        limit = settings.A2A_MAX_STREAMS
        if len(_registry.slots) >= limit:
            raise ProtocolError(
                UNAVAILABLE,
                f"this instance serves its maximum of {limit} concurrent streams; retry shortly "
                "(or on another instance)",
                reason="TOO_MANY_STREAMS",
                metadata={"limit": str(limit)},
                retry_after=RETRY_AFTER_SECONDS,
            )
        slot = Slot()
        _registry.slots.add(slot)
        return slot


def begin_shutdown() -> int:
    """Refuse new streams and end the open ones with a `retry:` hint. Returns how many."""
    with _registry.lock:
        _registry.shutting_down = True
        slots = list(_registry.slots)
    for slot in slots:
        slot.close()
    if slots:
        logger.info("closing open streams for shutdown", extra={"streams": len(slots)})
    return len(slots)


def install_signal_hooks() -> None:
    """Wrap the server's SIGTERM/SIGINT handlers so open streams end first.

    The server (uvicorn) waits for open responses to finish before its lifespan shutdown, so
    streams must be ended when it is told to stop, not at lifespan shutdown. Install this
    before any wrapper that delays the signal (the readiness drain in asgi.py): streams then
    keep flowing during the drain grace period and end when the server really stops.
    Main thread only (ValueError elsewhere).
    """
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum, frame, previous=previous) -> None:
            loop.call_soon_threadsafe(begin_shutdown)
            previous(signum, frame)

        signal.signal(sig, handler)


# --- Serving one stream ---------------------------------------------------------------------


Render = Callable[[object], Frame]
RenderError = Callable[[ProtocolError], Frame]


async def _wait_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _pump(send, source: AsyncIterator, render: Render, render_error: RenderError) -> None:
    try:
        async for item in source:
            frame = KEEPALIVE_FRAME if item is KEEPALIVE else render(item).encode()
            await send({"type": "http.response.body", "body": frame, "more_body": True})
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        # Mid-stream errors are an `event: error` carrying the binding's error body, then the
        # end of the stream (digest §4, §5).
        error = from_domain(exc)
        if error is None:
            logger.error("stream failed", exc_info=exc)
            error = ProtocolError(INTERNAL, "internal error")
        frame = render_error(error)
        await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})


class SSEResponse:
    """An ASGI response streaming `source` (items rendered by `render`; KEEPALIVE becomes a
    comment line) until the source ends, the client disconnects, or the process shuts down."""

    def __init__(
        self,
        source: AsyncIterator,
        *,
        slot: Slot,
        render: Render,
        render_error: RenderError,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.source = source
        self.slot = slot
        self.render = render
        self.render_error = render_error
        self.headers = {
            "content-type": MEDIA_TYPE,
            "cache-control": "no-store",
            "x-accel-buffering": "no",  # nginx: do not buffer the stream
            **{k.lower(): v for k, v in (headers or {}).items()},
        }

    async def discard(self) -> None:
        """Not served after all (a JSON-RPC notification): release the slot and the source."""
        self.slot.release()
        with contextlib.suppress(Exception):
            await self.source.aclose()

    async def __call__(self, scope, receive, send) -> None:
        slot = self.slot
        pump = watcher = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(k.encode(), v.encode()) for k, v in self.headers.items()],
                }
            )
            slot.loop = asyncio.get_running_loop()
            pump = asyncio.create_task(_pump(send, self.source, self.render, self.render_error))
            slot.pump = pump
            if slot.closing:
                pump.cancel()
            watcher = asyncio.create_task(_wait_disconnect(receive))
            await asyncio.wait({pump, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher.done():
                return  # the client is gone: nothing more to send
            if pump.cancelled() and slot.closing:
                retry_ms = int(settings.A2A_SSE_SHUTDOWN_RETRY_MS)
                hint = b": server shutting down; reconnect with Last-Event-ID\nretry: %d\n\n"
                await send(
                    {"type": "http.response.body", "body": hint % retry_ms, "more_body": True}
                )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            for task in (pump, watcher):
                if task is not None and not task.done():
                    task.cancel()
            for task in (pump, watcher):
                if task is not None:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            slot.release()
            aclose = getattr(self.source, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
