"""A fast webhook sink for the delivery bench: answers every request 200, records receipts.

One process, one asyncio loop (uvloop when installed) with httptools parsing raw HTTP/1.1 on
keep-alive connections: no framework, no per-request objects beyond one tuple, so it handles
tens of thousands of requests per second on one core and is never the bottleneck of a
delivery path that runs at hundreds to a few thousand per second.

For each request carrying `X-A2A-Task-Seq` it records `(receive time, task id, seq,
webhook-id)`; the receive time is `time.time()` when the last body byte arrived (wall clock,
comparable with the bench process's commit stamps on the same machine). Other requests
(e.g. wrk measuring the sink's own capacity) are only counted.

Control, on the same port:
  GET  /_stats   {"recorded": n, "unique": distinct webhook-ids, "other": n}
  GET  /_dump    {"records": [[t, task_id, seq, webhook_id], ...]}
  POST /_reset   forget everything

    .venv/bin/python bench/sink.py --port 8901
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httptools

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
OK_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class State:
    def __init__(self) -> None:
        self.records: list[tuple[float, str, int, str]] = []
        self.ids: set[str] = set()
        self.other = 0

    def reset(self) -> None:
        self.records = []
        self.ids = set()
        self.other = 0


STATE = State()


def _json(payload: dict) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


class Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.task_id = ""
        self.seq = -1
        self.webhook_id = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.task_id = ""
        self.seq = -1
        self.webhook_id = ""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"x-a2a-task-seq":
            self.seq = int(value)
        elif name == b"x-a2a-task-id":
            self.task_id = value.decode()
        elif name == b"webhook-id":
            self.webhook_id = value.decode()

    def on_message_complete(self) -> None:
        now = time.time()
        if self.seq >= 0:
            STATE.records.append((now, self.task_id, self.seq, self.webhook_id))
            STATE.ids.add(self.webhook_id)
            reply = OK
        elif self.url.startswith(b"/_stats"):
            reply = _json(
                {"recorded": len(STATE.records), "unique": len(STATE.ids), "other": STATE.other}
            )
        elif self.url.startswith(b"/_dump"):
            reply = _json({"records": STATE.records})
        elif self.url.startswith(b"/_reset"):
            STATE.reset()
            reply = OK
        else:
            STATE.other += 1
            reply = OK
        if self.parser.should_keep_alive():
            self.transport.write(reply)
        else:
            self.transport.write(reply if reply is not OK else OK_CLOSE)
            self.transport.close()


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Sink, "127.0.0.1", port, backlog=1024)
    print(f"sink ready on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.port))
    else:
        uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
