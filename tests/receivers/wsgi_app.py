"""The WSGI app gunicorn and Werkzeug serve (tests/receivers/answers.py: the answers).

WSGI hands an app the headers as `HTTP_*` environ keys, a repeated header already joined
with "," by the server: these receivers record that view, not the raw list (names rebuilt in
lower case, `_` as `-`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from tests.receivers import answers

SERVED = ("/hook", "/chunked", "/close", "/slow", "/gone", "/redirect", answers.REDIRECT_TARGET)

REASONS = {200: "OK", 302: "Found", 404: "Not Found", 410: "Gone"}


def environ_headers(environ: dict) -> list[tuple[str, str]]:
    out = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            out.append((key[5:].replace("_", "-").lower(), value))
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value:
            out.append((key.replace("_", "-").lower(), value))
    return out


def make_app(recorder: answers.Recorder):
    def app(environ: dict, start_response) -> Iterable[bytes]:
        received = answers.now()
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        path = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ["PATH_INFO"]
        answer = answers.answer_for(environ["PATH_INFO"], SERVED)
        recorder.write(
            received=received,
            method=environ["REQUEST_METHOD"],
            path=path,
            headers=environ_headers(environ),
            body=body,
            answer=answer,
        )
        payload = answers.body_for(answer)
        status = f"{answer['status']} {REASONS[answer['status']]}"
        headers = [("Content-Type", "application/json")]
        if answer["kind"] == "redirect":
            headers.append(("Location", answer["location"]))
        if answer["kind"] == "close":
            headers.append(("Connection", "close"))
        if answer["kind"] == "chunked":  # no length on HTTP/1.1: the server sends it chunked
            start_response(status, headers)
            return answers.pieces(payload)
        headers.append(("Content-Length", str(len(payload))))
        start_response(status, headers)
        if answer["kind"] == "slow":
            return _trickled(answers.slow_pieces(payload))
        return [payload]

    return app


def _trickled(parts: list[bytes]) -> Iterator[bytes]:
    for i, piece in enumerate(parts):
        if i:
            time.sleep(answers.SLOW_INTERVAL)
        yield piece
