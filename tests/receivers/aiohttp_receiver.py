"""A webhook receiver on aiohttp's web server (tests/receivers/answers.py: the answers).

aiohttp's server parses requests strictly: a request carrying a singleton header twice (e.g.
`User-Agent`) is answered 400 "Duplicate 'User-Agent' header found" before any handler runs,
so such a delivery is never recorded. The headers are recorded raw (`request.raw_headers`).

    python -m tests.receivers.aiohttp_receiver --port P --record FILE
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from tests.receivers import answers

SERVED = ("/hook", "/chunked", "/slow", "/gone", "/redirect", answers.REDIRECT_TARGET)


def make_app(recorder: answers.Recorder) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        received = answers.now()
        body = await request.read()
        answer = answers.answer_for(request.path, SERVED)
        recorder.write(
            received=received,
            method=request.method,
            path=request.raw_path,
            headers=answers.decoded(request.raw_headers),
            body=body,
            answer=answer,
        )
        payload = answers.body_for(answer)
        headers = {"Content-Type": "application/json"}
        if answer["kind"] == "redirect":
            headers["Location"] = answer["location"]
        if answer["kind"] not in ("chunked", "slow"):
            return web.Response(status=answer["status"], body=payload, headers=headers)
        response = web.StreamResponse(status=answer["status"], headers=headers)
        if answer["kind"] == "chunked":
            response.enable_chunked_encoding()
            await response.prepare(request)
            for piece in answers.pieces(payload):
                await response.write(piece)
        else:  # slow: a known length, trickled
            response.content_length = len(payload)
            await response.prepare(request)
            for i, piece in enumerate(answers.slow_pieces(payload)):
                if i:
                    await asyncio.sleep(answers.SLOW_INTERVAL)
                await response.write(piece)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def serve(port: int, recorder: answers.Recorder) -> None:
    runner = web.AppRunner(make_app(recorder), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, answers.HOST, port).start()
    answers.announce(port)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    args = answers.parse_args(__doc__.split("\n\n")[0], argv)
    asyncio.run(serve(args.port, answers.Recorder(args.record)))


if __name__ == "__main__":
    main()
