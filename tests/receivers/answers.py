"""The answer kinds of the receiver matrix, by request path, and the recording every Python
receiver shares (the node receiver, tests/receivers/node_receiver.js, mirrors both).

    /hook        200, Content-Length                 the plain answer
    /chunked     200, Transfer-Encoding: chunked     no Content-Length, the body in pieces
    /close       200, Connection: close              the server closes after the answer
    /slow        200, the head at once, then the body trickled over ~0.5 s (6 pieces), well
                 inside the 2 s delivery timeout the tests use
    /eof         200 without Content-Length on HTTP/1.0: the body ends when the server closes
    /gone        410 Gone                            final: dead-lettered, no retry
    /redirect    302, Location: /redirected          final: a sender must not follow it
    /redirected  200                                 so that a sender following the 302 would
                                                     look delivered (and be caught: a request
                                                     here is the test failing)

A record is written once the request body has been read and before the answer starts, with
the headers as the stack hands them over: raw (names as sent, duplicates kept) where it can.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
BODY = b'{"ok":true}'
# The slow body: this many pieces, 0.1 s apart (the last ~0.5 s after the head).
SLOW_PIECES = 6
SLOW_INTERVAL = 0.1
REDIRECT_TARGET = "/redirected"

ANSWERS: dict[str, dict[str, Any]] = {
    "/hook": {"status": 200, "kind": "plain"},
    "/chunked": {"status": 200, "kind": "chunked"},
    "/close": {"status": 200, "kind": "close"},
    "/slow": {"status": 200, "kind": "slow"},
    "/eof": {"status": 200, "kind": "eof"},
    "/gone": {"status": 410, "kind": "gone"},
    "/redirect": {"status": 302, "kind": "redirect", "location": REDIRECT_TARGET},
    REDIRECT_TARGET: {"status": 200, "kind": "redirected"},
}
NOT_SERVED = {"status": 404, "kind": "not-served"}


def answer_for(path: str, served: Iterable[str]) -> dict[str, Any]:
    """The answer for a request path (its query ignored), if this stack serves it."""
    path = path.split("?", 1)[0]
    return dict(ANSWERS[path]) if path in served and path in ANSWERS else dict(NOT_SERVED)


def body_for(answer: dict[str, Any]) -> bytes:
    status = answer["status"]
    return BODY if 200 <= status < 300 else f"status {status}".encode()


def pieces(body: bytes, count: int = 3) -> list[bytes]:
    """`body` cut in `count` non-empty pieces (a chunked or trickled answer's writes)."""
    assert len(body) >= count
    return [body[len(body) * i // count : len(body) * (i + 1) // count] for i in range(count)]


def slow_pieces(body: bytes) -> list[bytes]:
    return pieces(body, SLOW_PIECES)


class Recorder:
    """Appends the records: one `os.write` per line on an O_APPEND descriptor, so a reader
    sees whole lines only (or a trailing partial one, which it skips)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.lock = threading.Lock()
        self.count = 0

    def write(
        self,
        *,
        received: float,
        method: str,
        path: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        answer: dict[str, Any],
    ) -> None:
        with self.lock:
            self.count += 1
            entry = {
                "n": self.count,
                "at": received,
                "method": method,
                "path": path,
                "headers": [[k, v] for k, v in headers],
                "body_b64": base64.b64encode(body).decode("ascii"),
                "answer": answer,
            }
            os.write(self.fd, (json.dumps(entry) + "\n").encode())


def decoded(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """Raw header pairs (bytes, as on the wire) as text."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The command line every receiver takes (ReceiverProcess passes it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    return parser.parse_args(argv)


def announce(port: int) -> None:
    """The line ReceiverProcess waits for: printed once the socket listens."""
    print(f"listening on {HOST}:{port}", flush=True)  # noqa: T201


def now() -> float:
    return time.time()
