"""A webhook receiver that verifies as a client would, live, on aiohttp's server: the far side
of the rebind tests (tests/integration/webhooks/test_rebind_processes.py). It is the strict
receiver of docs/webhooks-receiving.md, section 5 (its example, with the receiver library only:
webhooks/receiver.py, no Django):

    python -m tests.receivers.verifying_receiver --port P --record FILE --jwks URL --mode M
        [--issuer AGENT_URL]

    --mode jwks-poll   re-reads the agent's JWKS every 2 s and trusts only what it last read
                       (never fetches on an unknown key: the incident's client)
    --mode channels    keeps a per-task channel history (webhooks.receiver.ChannelTrust),
                       learning new channels from verified notices

Every delivery is verified (`WebhookVerifier.verify`): its signature, and its Bearer JWT with
the URL the request came to as the audience and, with `--issuer`, the agent's URL as the
issuer. Every verified delivery is then read with `parse_channel_notice`: a malformed notice
is refused, and so is a notice that names no JWKS URL (a `channel-changed` one) or another
JWKS URL than the one configured (`--jwks`): section 5 says to settle that with the operator,
never to follow it.

A delivery that passes is answered 200 (`{"status": 200, "kind": "verified"}`, with
`"notice"` and `"jwksUrl"` for a notice); one that does not is refused as the section's
example does (403 for a `ChannelError`, 400 for `headers` / `payload`, else 401), with the
reason recorded in the answer (`{"status": ..., "kind": "rejected", "reason": ...}`).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.receivers import answers
from webhooks.receiver import (
    NOTICE_CHANNEL_CHANGED,
    ChannelError,
    ChannelTrust,
    VerificationError,
    WebhookVerifier,
    parse_channel_notice,
)

POLL_SECONDS = 2.0


def _check(
    verifier: WebhookVerifier,
    channels: ChannelTrust | None,
    headers: dict[str, str],
    body: bytes,
    url: str,
    issuer: str | None,
) -> dict[str, Any]:
    """Verify one delivery and read its notice, as docs/webhooks-receiving.md's example does:
    the answer to record (raises VerificationError when it is refused)."""
    delivery = verifier.verify(
        headers, body, expected_audience=url, expected_issuer=issuer, channels=channels
    )
    notice = parse_channel_notice(delivery)  # VerificationError("payload") when malformed
    if notice is None:
        return {"status": 200, "kind": "verified"}
    if notice.kind == NOTICE_CHANNEL_CHANGED and not notice.jwks_url:
        raise VerificationError("payload", "a channel-changed notice names no jwksUrl")
    if notice.jwks_url and notice.jwks_url != verifier.jwks_url:
        raise VerificationError(
            "payload",
            f"the notice names the JWKS {notice.jwks_url}, not the configured "
            f"{verifier.jwks_url} (settle it with the operator; never follow it)",
        )
    return {"status": 200, "kind": "verified", "notice": notice.kind, "jwksUrl": notice.jwks_url}


def make_app(
    recorder: answers.Recorder, verifier: WebhookVerifier, mode: str, issuer: str | None = None
) -> web.Application:
    channels = ChannelTrust() if mode == "channels" else None

    async def handle(request: web.Request) -> web.Response:
        received = answers.now()
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        # The URL this request came to: a webhook JWT's audience (it changes with a move).
        url = f"{request.scheme}://{request.host}{request.raw_path}"
        try:
            answer = await asyncio.to_thread(_check, verifier, channels, headers, body, url, issuer)
        except ChannelError as exc:
            answer = {"status": 403, "kind": "rejected", "reason": str(exc)}
        except VerificationError as exc:
            status = 400 if exc.reason in {"headers", "payload"} else 401
            answer = {"status": status, "kind": "rejected", "reason": str(exc)}
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
    app = make_app(answers.Recorder(args.record), verifier, args.mode, args.issuer)
    runner = web.AppRunner(app)
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
    parser.add_argument("--issuer", default=None, help="the agent's URL, a webhook JWT's iss")
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
