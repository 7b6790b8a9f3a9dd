"""A webhook receiver that verifies as a client would, live, on aiohttp's server: the far side
of the rebind tests (tests/integration/webhooks/test_rebind_processes.py).

    python -m tests.receivers.verifying_receiver --port P --record FILE --jwks URL --mode M

    --mode jwks-poll   re-reads the agent's JWKS every 2 s and trusts only what it last read
                       (never fetches on an unknown key: the incident's client)
    --mode channels    keeps a per-task channel history (webhooks.receiver.ChannelTrust),
                       learning new channels from verified notices

A delivery that verifies is answered 200; one that does not, 401 with the reason, which is
recorded in the answer (`{"status": 401, "reason": ...}`). It uses the receiver library only
(webhooks/receiver.py: no Django).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from aiohttp import web

from tests.receivers import answers
from webhooks.receiver import ChannelTrust, VerificationError, WebhookVerifier

POLL_SECONDS = 2.0


def make_app(recorder: answers.Recorder, verifier: WebhookVerifier, mode: str) -> web.Application:
    channels = ChannelTrust() if mode == "channels" else None

    async def handle(request: web.Request) -> web.Response:
        received = answers.now()
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            await asyncio.to_thread(verifier.verify, headers, body, channels=channels)
            answer = {"status": 200, "kind": "verified"}
        except VerificationError as exc:
            answer = {"status": 401, "kind": "rejected", "reason": str(exc)}
        recorder.write(
            received=received,
            method=request.method,
            path=request.raw_path,
            headers=answers.decoded(request.raw_headers),
            body=body,
            answer=answer,
        )
        return web.Response(status=answer["status"], body=answers.BODY)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def poll(verifier: WebhookVerifier) -> None:
    while True:
        await asyncio.sleep(POLL_SECONDS)
        await asyncio.to_thread(verifier.refresh, force=True)


async def serve(args: argparse.Namespace) -> None:
    # jwks-poll never fetches on its own between polls (a huge refresh interval).
    verifier = WebhookVerifier(
        jwks_url=args.jwks, min_refresh_seconds=1e9 if args.mode == "jwks-poll" else 5
    )
    verifier.refresh(force=True)
    runner = web.AppRunner(make_app(answers.Recorder(args.record), verifier, args.mode))
    await runner.setup()
    await web.TCPSite(runner, answers.HOST, args.port).start()
    if args.mode == "jwks-poll":
        asyncio.get_running_loop().create_task(poll(verifier))
    answers.announce(args.port)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--jwks", required=True)
    parser.add_argument("--mode", choices=["jwks-poll", "channels"], required=True)
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
