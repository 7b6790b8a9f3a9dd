"""A webhook receiver: uvicorn serving a Starlette app (tests/receivers/answers.py: the
answers). The headers are recorded as the ASGI scope has them: raw pairs, duplicates kept.

    python -m tests.receivers.starlette_receiver --port P --record FILE

The socket is bound and listening before `listening on` is printed, then handed to uvicorn,
so the line means connections are accepted (uvicorn's own banner comes after its lifespan).
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.receivers import answers

SERVED = ("/hook", "/chunked", "/close", "/slow", "/gone", "/redirect", answers.REDIRECT_TARGET)
METHODS = ["GET", "POST", "PUT"]


def make_app(recorder: answers.Recorder) -> Starlette:
    async def handle(request: Request) -> Response:
        received = answers.now()
        body = await request.body()
        answer = answers.answer_for(request.url.path, SERVED)
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        query = request.scope.get("query_string") or b""
        path = raw_path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
        recorder.write(
            received=received,
            method=request.method,
            path=path,
            headers=answers.decoded(request.headers.raw),
            body=body,
            answer=answer,
        )
        payload = answers.body_for(answer)
        headers = {}
        if answer["kind"] == "redirect":
            headers["Location"] = answer["location"]
        if answer["kind"] == "close":
            headers["Connection"] = "close"  # uvicorn then closes after the response
        if answer["kind"] == "chunked":  # no length: uvicorn sends it chunked
            return StreamingResponse(
                _pieces(answers.pieces(payload), 0), media_type="application/json"
            )
        if answer["kind"] == "slow":
            return StreamingResponse(
                _pieces(answers.slow_pieces(payload), answers.SLOW_INTERVAL),
                media_type="application/json",
                headers={"Content-Length": str(len(payload))},
            )
        return Response(payload, answer["status"], headers, media_type="application/json")

    routes = [Route("/{tail:path}", handle, methods=METHODS)]
    return Starlette(routes=routes)


async def _pieces(parts: list[bytes], interval: float):
    for i, piece in enumerate(parts):
        if i and interval:
            await asyncio.sleep(interval)
        yield piece


def main(argv: list[str] | None = None) -> None:
    args = answers.parse_args(__doc__.split("\n\n")[0], argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((answers.HOST, args.port))
    sock.listen(128)
    sock.set_inheritable(True)
    config = uvicorn.Config(
        make_app(answers.Recorder(args.record)),
        access_log=False,
        log_level="warning",
        lifespan="off",
    )
    answers.announce(args.port)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
