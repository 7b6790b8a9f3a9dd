"""A webhook receiver PROCESS for integration and fault tests: the far side we do not own.

    python -m tests.webhook_receiver --port P --record FILE --control FILE
                                     [--tls-cert PEM --tls-key PEM]     (https)

It uses the standard library only (nothing of the platform, no Django), listens on
127.0.0.1:P with a `ThreadingHTTPServer`, and appends one JSON line per request to the record
file, written when the request has been read and before it is answered:

    {"n": 1, "at": <Unix time received>, "method": "POST", "path": "/hook",
     "headers": [[name, value], ...], "body_b64": "...", "answer": {<behaviour applied>}}

Before answering, it reads the control file (JSON; absent or unreadable means
`{"status": 200}`) for its behaviour:

    {"status": 500}                      answer 500
    {"status": 429, "retry_after": 1}    answer 429 with `Retry-After: 1`
    {"hang": 30}                         answer nothing for 30 s (then `status`, default 200)
    {"status": 401} / {"status": 200}
    {"sequence": [b1, b2, ...]}          the k-th request since this control was written gets
                                         b_k; the last one repeats

`ReceiverProcess` (below) starts, stops and restarts it, changes its behaviour (atomically:
write a temporary file, then rename) and reads its records. It starts other receivers too
(`command=`: the stacks of tests/receivers/, which answer by path, not by a control file):
any program that takes `--port P --record FILE`, prints `listening on 127.0.0.1:P` once it
accepts connections, and writes the records above.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import os
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"

# --- the server (runs in the receiver process) ----------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, port: int, record: Path, control: Path) -> None:
        self.record_fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.control = control
        self.lock = threading.Lock()
        self.count = 0
        self.control_text: str | None = None
        self.control_count = 0  # requests answered under the current control text
        super().__init__((HOST, port), _Handler)

    def behaviour(self) -> dict[str, Any]:
        """This request's behaviour (and it counts as one more under the current control)."""
        try:
            text = self.control.read_text()
        except OSError:
            text = ""
        with self.lock:
            if text != self.control_text:
                self.control_text, self.control_count = text, 0
            index = self.control_count
            self.control_count += 1
        try:
            control = json.loads(text) if text.strip() else {}
        except ValueError:
            control = {}
        if not isinstance(control, dict):
            control = {}
        sequence = control.get("sequence")
        if isinstance(sequence, list) and sequence:
            step = sequence[min(index, len(sequence) - 1)]
            control = step if isinstance(step, dict) else {}
        return control

    def write_record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.count += 1
            entry = {"n": self.count, **entry}
            # One write on an O_APPEND descriptor: a reader sees whole lines only (or a
            # trailing partial one, which it skips).
            os.write(self.record_fd, (json.dumps(entry) + "\n").encode())


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, as most receivers
    disable_nagle_algorithm = True  # the head and the body go in separate writes

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass

    def _handle(self) -> None:
        received = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        behaviour = self.server.behaviour()
        self.server.write_record(
            {
                "at": received,
                "method": self.command,
                "path": self.path,
                "headers": [[k, v] for k, v in self.headers.items()],
                "body_b64": base64.b64encode(body).decode("ascii"),
                "answer": behaviour,
            }
        )
        hang = float(behaviour.get("hang") or 0)
        if hang > 0:
            time.sleep(hang)
        status = int(behaviour.get("status") or 200)
        payload = b'{"ok":true}' if 200 <= status < 300 else f"status {status}".encode()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            if behaviour.get("retry_after") is not None:
                self.send_header("Retry-After", str(behaviour["retry_after"]))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    do_POST = _handle  # noqa: N815 (http.server's naming)
    do_PUT = _handle  # noqa: N815
    do_GET = _handle  # noqa: N815


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--tls-cert", type=Path, help="serve https with this certificate")
    parser.add_argument("--tls-key", type=Path)
    args = parser.parse_args(argv)
    server = _Server(args.port, args.record, args.control)
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        # The handshake happens on the connection's thread, at its first read.
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    print(f"listening on {HOST}:{server.server_address[1]}", flush=True)  # noqa: T201
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()


# --- the test-side helper -------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One request the receiver got."""

    n: int
    at: float  # Unix time it was received
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    answer: dict[str, Any]
    # The headers as recorded: names as sent, in order, a repeated one repeated (as raw as the
    # receiver's stack hands them over; `headers` keeps the last of each name).
    raw_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def seq(self) -> int:
        return int(self.headers["x-a2a-task-seq"])

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


class ReceiverProcess:
    """A `python -m tests.webhook_receiver` child on a fixed port (kept across restarts, so a
    registered webhook URL stays valid), with its records and control file in `log_dir`.
    `command` starts that program instead (given `--port P --record FILE`; it reads no
    control file).
    `tls` (a certificate for `localhost` and its key: `.cert_path`, `.key_path`, e.g.
    tests.tls.Leaf) makes it serve https, and its URL https://localhost:PORT/hook."""

    def __init__(
        self,
        log_dir: Path,
        name: str = "receiver",
        path: str = "/hook",
        tls=None,
        command: Sequence[str] | None = None,
    ) -> None:
        from tests.live import free_port

        self.log_dir = log_dir
        self.name = name
        self.port = free_port()
        self.path = path
        self.command = list(command) if command is not None else None
        self.tls = tls
        self.record_path = log_dir / f"{name}.records.jsonl"
        self.control_path = log_dir / f"{name}.control.json"
        self.proc = None
        self.procs: list = []  # every process started, for their logs

    @property
    def url(self) -> str:
        return f"{self.origin}{self.path}"

    @property
    def origin(self) -> str:
        return f"https://localhost:{self.port}" if self.tls else f"http://{HOST}:{self.port}"

    def at(self, path: str) -> ReceiverProcess:
        """This receiver with webhooks registered at `path` (`url` and `path` differ; the
        process, port and records are the same): for a receiver that answers by path. Read
        and register with it; start and stop the original."""
        view = copy.copy(self)
        view.path = path
        return view

    def behave(self, **behaviour: Any) -> None:
        """Set the behaviour for the requests that follow (see the module docstring)."""
        if self.command is not None:
            raise TypeError(f"{self.name} answers by path; it reads no control file")
        tmp = self.control_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(behaviour))
        os.replace(tmp, self.control_path)

    def start(self, timeout: float = 15) -> ReceiverProcess:
        from tests.processes import Proc, process_env

        name = self.name if not self.procs else f"{self.name}-{len(self.procs) + 1}"
        cmd = [
            *(self.command or [sys.executable, "-m", "tests.webhook_receiver"]),
            "--port",
            str(self.port),
            "--record",
            str(self.record_path),
        ]
        if self.command is None:
            cmd += ["--control", str(self.control_path)]
        if self.tls:
            cmd += ["--tls-cert", str(self.tls.cert_path), "--tls-key", str(self.tls.key_path)]
        self.proc = Proc(name, cmd, process_env(), self.log_dir)
        self.procs.append(self.proc)
        self.proc.wait_for_log(f"listening on {HOST}:{self.port}", timeout=timeout)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=5)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.popen.poll() is None

    def records(self) -> list[Record]:
        try:
            text = self.record_path.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                break  # being written
            raw = json.loads(line)
            raw_headers = tuple((k, v) for k, v in raw["headers"])
            out.append(
                Record(
                    n=raw["n"],
                    at=raw["at"],
                    method=raw["method"],
                    path=raw["path"],
                    headers={k.lower(): v for k, v in raw_headers},
                    body=base64.b64decode(raw["body_b64"]),
                    answer=raw["answer"],
                    raw_headers=raw_headers,
                )
            )
        return out

    def wait_for(self, predicate, timeout: float = 30, message: str = "records") -> list[Record]:
        """Poll the records until `predicate(records)` is true; return them."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.records()
            if predicate(records):
                return records
            if time.monotonic() > deadline:
                summary = [(r.n, r.header("x-a2a-task-seq"), r.answer) for r in records]
                raise TimeoutError(f"{self.name}: {message} not reached in {timeout}s: {summary}")
            time.sleep(0.05)

    def log(self) -> str:
        return "".join(proc.log() for proc in self.procs)


if __name__ == "__main__":
    main()
