"""The strict receiver of docs/webhooks-receiving.md §5, in the test process on a real socket,
and the operator's `rebind` command: what the rebind tests drive and check with.

`StrictReceiver(jwks_url)` verifies every request with the project's receiver library as §5
uses it (`WebhookVerifier` + `ChannelTrust`; each notice parsed with `parse_channel_notice`
and its `jwksUrl` compared with the JWKS URL it was configured with, the one the agent's card
names) and records each answer; its `mode` says what it answers once a request verified.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.core.management import call_command
from django.core.management.base import CommandError

from tests.integration.protocol.conftest import Wire
from webhooks.receiver import (
    ChannelError,
    ChannelTrust,
    VerificationError,
    WebhookVerifier,
    parse_channel_notice,
)


@dataclass
class Answer:
    task_id: str | None
    version: str | None
    kind: str  # "accepted", "channel", "invalid", "refused", "down"
    detail: str = ""


@dataclass
class StrictReceiver:
    """One client's receiver: every request is verified with the project's receiver library
    as docs §5 use it; `mode` is what it answers once verified (accept: 200, refuse: 400,
    down: 503 without reading the delivery). The JWKS is read from the URL the agent's card
    names, through the platform's own app."""

    jwks_url: str
    mode: str = "accept"
    answers: list[Answer] = field(default_factory=list)

    def __post_init__(self) -> None:
        path = self.jwks_url.split("://", 1)[1].split("/", 1)[1]
        self.verifier = WebhookVerifier(
            self.jwks_url,
            fetch=lambda url: Wire().request("GET", "/" + path).json(),
            min_refresh_seconds=0,
        )
        self.trust = ChannelTrust()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = receiver.handle(headers, body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        task_id = headers.get("x-a2a-task-id")
        version = headers.get("x-a2a-binding-version")
        with self.lock:
            if self.mode == "down":
                self.answers.append(Answer(task_id, version, "down"))
                return 503
            try:
                delivery = self.verifier.verify(headers, body, channels=self.trust)
                notice = parse_channel_notice(delivery)
            except ChannelError as exc:
                self.answers.append(Answer(task_id, version, "channel", str(exc)))
                return 403
            except VerificationError as exc:
                # What was offered and what the JWKS held, to tell a key problem apart.
                offered = headers.get("x-a2a-signature-key-ids", "")
                held = ",".join(self.verifier.key_ids)
                detail = f"{exc} (offered kids {offered}; JWKS {held})"
                self.answers.append(Answer(task_id, version, "invalid", detail))
                return 400
            if notice is not None and notice.jwks_url != self.jwks_url:
                self.answers.append(Answer(task_id, version, "invalid", f"jwksUrl {notice}"))
                return 400
            if self.mode == "refuse":
                self.answers.append(Answer(task_id, version, "refused"))
                return 400
            self.answers.append(Answer(task_id, version, "accepted"))
            return 200

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def command(*args: str) -> str | None:
    """The operator's `rebind` command; None when it refused (exit 2: nothing changed)."""
    out = io.StringIO()
    try:
        call_command("rebind", *args, stdout=out, stderr=io.StringIO())
    except CommandError:
        return None
    return out.getvalue().strip().splitlines()[0] if out.getvalue().strip() else ""
