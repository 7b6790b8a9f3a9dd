"""SSE clients for the streaming tests: one drives the ASGI app in-process (httpx's
ASGITransport buffers a whole response, so it cannot show a stream as it happens or a client
going away), one reads a live server over HTTP with httpx.

Both yield parsed events: `SSE(id, event, data, retry)` for events (data parsed as JSON) and
`SSE(comment=...)` for comment lines.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from a2a_platform.protocol import sse


@dataclass(frozen=True)
class SSE:
    id: int | None = None
    event: str | None = None
    data: Any = None
    retry: int | None = None
    comment: str | None = None

    @property
    def is_comment(self) -> bool:
        return self.comment is not None


def parse_block(block: str) -> list[SSE]:
    """One `\\n\\n`-terminated block: its comment lines, then the event (if it has fields)."""
    out: list[SSE] = []
    fields: dict[str, str] = {}
    data: list[str] = []
    for line in block.split("\n"):
        if not line:
            continue
        if line.startswith(":"):
            out.append(SSE(comment=line[1:].strip()))
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "data":
            data.append(value)
        else:
            fields[key] = value
    if data or fields:
        out.append(
            SSE(
                id=int(fields["id"]) if "id" in fields else None,
                event=fields.get("event"),
                data=json.loads("\n".join(data)) if data else None,
                retry=int(fields["retry"]) if "retry" in fields else None,
            )
        )
    return out


class _Frames:
    def __init__(self) -> None:
        self.buffer = ""

    def feed(self, chunk: str) -> list[SSE]:
        self.buffer += chunk
        out: list[SSE] = []
        while "\n\n" in self.buffer:
            block, self.buffer = self.buffer.split("\n\n", 1)
            out += parse_block(block)
        return out


_CLOSED = object()


class ASGIStream:
    """One request to an ASGI app, read as it is produced; `disconnect()` plays a client that
    goes away."""

    def __init__(
        self,
        app,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        body = b"" if json_body is None else json.dumps(json_body).encode()
        hdrs = {"host": "testserver", **{k.lower(): v for k, v in (headers or {}).items()}}
        if json_body is not None:
            hdrs.setdefault("content-type", "application/json")
            hdrs["content-length"] = str(len(body))
        path, _, query = path.partition("?")
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.encode(), v.encode()) for k, v in hdrs.items()],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self.body = body
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.raw = b""
        self._sent_body = False
        self._gone = asyncio.Event()
        self._started = asyncio.Event()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._frames = _Frames()
        self.task: asyncio.Task | None = None

    async def _receive(self) -> dict:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
            self._started.set()
            return
        chunk = message.get("body", b"")
        self.raw += chunk
        if "text/event-stream" in self.headers.get("content-type", ""):
            for event in self._frames.feed(chunk.decode()):
                await self._queue.put(event)
        if not message.get("more_body", False):
            await self._queue.put(_CLOSED)

    async def open(self, timeout: float = 10) -> ASGIStream:
        self.task = asyncio.create_task(self.app(self.scope, self._receive, self._send))
        starting = asyncio.create_task(self._started.wait())
        done, _ = await asyncio.wait(
            {starting, self.task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if self.task in done and not self._started.is_set():
            starting.cancel()
            self.task.result()  # raises the app's error
        if not self._started.is_set():
            starting.cancel()
            raise TimeoutError("no response started")
        return self

    @property
    def is_stream(self) -> bool:
        return "text/event-stream" in self.headers.get("content-type", "")

    async def json(self, timeout: float = 10) -> Any:
        """The whole (non-stream) body as JSON."""
        await asyncio.wait_for(self.task, timeout)
        return json.loads(self.raw)

    async def next(self, timeout: float = 10, *, comments: bool = False) -> SSE | None:
        """The next event (None once the stream ended); comments skipped unless asked."""
        while True:
            item = await asyncio.wait_for(self._queue.get(), timeout)
            if item is _CLOSED:
                await self._queue.put(_CLOSED)
                return None
            if item.is_comment and not comments:
                continue
            return item

    async def until_closed(self, timeout: float = 10) -> list[SSE]:
        out = []
        while (event := await self.next(timeout)) is not None:
            out.append(event)
        await asyncio.wait_for(self.task, timeout)
        return out

    async def disconnect(self, timeout: float = 5) -> None:
        self._gone.set()
        await asyncio.wait_for(self.task, timeout)


async def http_events(
    client: httpx.AsyncClient, method: str, url: str, **kw
) -> AsyncIterator[tuple[httpx.Response, SSE]]:
    """Events of a live stream (comments included), with the response they came on."""
    frames = _Frames()
    async with client.stream(method, url, **kw) as response:
        if "text/event-stream" not in response.headers.get("content-type", ""):
            await response.aread()
            yield response, SSE(data=response.json())
            return
        async for chunk in response.aiter_text():
            for event in frames.feed(chunk):
                yield response, event


def streams_reset() -> None:
    """Forget this process's open streams and its shutdown (as a new process starts)."""
    sse._registry = sse._Registry()


def open_streams() -> int:
    """How many streams this process serves now."""
    return len(sse._registry.slots)
