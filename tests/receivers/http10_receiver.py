"""A webhook receiver on Python's `http.server` with its DEFAULT protocol version, HTTP/1.0:
every answer is an HTTP/1.0 response and the connection is closed after it (no keep-alive),
as the many receivers written in a few lines of the standard library do.

    python -m tests.receivers.http10_receiver --port P --record FILE

`/eof` answers without Content-Length: on HTTP/1.0 the body ends when the server closes. The
headers are recorded as `http.server` parsed them: in order, duplicates kept.
"""

from __future__ import annotations

import contextlib
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.receivers import answers

SERVED = ("/hook", "/eof", "/slow", "/gone", "/redirect", answers.REDIRECT_TARGET)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, port: int, recorder: answers.Recorder) -> None:
        self.recorder = recorder
        super().__init__((answers.HOST, port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # protocol_version is left at BaseHTTPRequestHandler's default, "HTTP/1.0".

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass

    def _handle(self) -> None:
        received = answers.now()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        answer = answers.answer_for(self.path, SERVED)
        self.server.recorder.write(
            received=received,
            method=self.command,
            path=self.path,
            headers=list(self.headers.items()),
            body=body,
            answer=answer,
        )
        payload = answers.body_for(answer)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(answer["status"])
            self.send_header("Content-Type", "application/json")
            if answer["kind"] == "redirect":
                self.send_header("Location", answer["location"])
            if answer["kind"] != "eof":
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if answer["kind"] == "slow":
                for i, piece in enumerate(answers.slow_pieces(payload)):
                    if i:
                        time.sleep(answers.SLOW_INTERVAL)
                    self.wfile.write(piece)
                    self.wfile.flush()
            else:
                self.wfile.write(payload)

    do_POST = _handle  # noqa: N815 (http.server's naming)
    do_PUT = _handle  # noqa: N815
    do_GET = _handle  # noqa: N815


def main(argv: list[str] | None = None) -> None:
    args = answers.parse_args(__doc__.split("\n\n")[0], argv)
    server = _Server(args.port, answers.Recorder(args.record))
    answers.announce(args.port)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
