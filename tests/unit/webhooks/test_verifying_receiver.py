"""tests/receivers/verifying_receiver.py is the strict receiver of docs/webhooks-receiving.md,
section 5: every verified delivery is read with parse_channel_notice, and a malformed notice,
or one naming no JWKS or another JWKS than the one configured, is refused (non-2xx) with the
reason recorded. (The rebind process tests rely on it: tests/integration/webhooks/
test_rebind_processes.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.receivers import answers
from tests.receivers.verifying_receiver import make_app
from tests.unit.webhooks.test_receiver import NOW, Sender, jwks, status_body
from tests.unit.webhooks.test_receiver_channels import JWKS_URL, V1, notice_body
from webhooks.receiver import WebhookVerifier


@pytest.fixture
def key_a():
    return ("kid-a", Ed25519PrivateKey.generate())


def post_all(tmp_path, key, bodies: list[bytes], mode: str = "channels") -> list[dict]:
    """Each body delivered (signed, under cfg-1.v1) to the receiver's app; its records'
    answers, in order."""
    verifier = WebhookVerifier(jwks_url=JWKS_URL, jwks=jwks(key), clock=lambda: NOW)
    record = tmp_path / "records.jsonl"
    sender = Sender([key])

    async def go() -> list[int]:
        app = make_app(answers.Recorder(record), verifier, mode)
        async with TestClient(TestServer(app)) as client:
            statuses = []
            for i, body in enumerate(bodies):
                sent = sender.deliver(event_id=f"evt_{i}", seq=i + 1, body=body, binding_version=V1)
                resp = await client.post("/hooks/v1/task-0", data=sent.body, headers=sent.headers)
                statuses.append(resp.status)
            return statuses

    statuses = asyncio.run(go())
    recorded = [json.loads(line)["answer"] for line in record.read_text().splitlines()]
    assert [a["status"] for a in recorded] == statuses
    return recorded


@pytest.mark.parametrize("mode", ["channels", "jwks-poll"])
def test_a_notice_naming_the_configured_jwks_is_read_and_accepted(tmp_path, key_a, mode):
    got = post_all(tmp_path, key_a, [status_body(), notice_body(from_seq=2)], mode)
    assert got == [
        {"status": 200, "kind": "verified"},
        {"status": 200, "kind": "verified", "notice": "channel-changed", "jwksUrl": JWKS_URL},
    ]


@pytest.mark.parametrize("mode", ["channels", "jwks-poll"])
def test_a_malformed_notice_is_refused_with_its_reason(tmp_path, key_a, mode):
    malformed = notice_body(from_seq=None)  # a channel-changed notice without fromSeq
    [first, got] = post_all(tmp_path, key_a, [status_body(), malformed], mode)
    assert first["status"] == 200
    assert (got["status"], got["kind"]) == (400, "rejected")
    assert got["reason"].startswith("payload: ")
    assert "fromSeq" in got["reason"]


def without_jwks_url(body: bytes) -> bytes:
    parsed = json.loads(body)
    [entry] = parsed["statusUpdate"]["metadata"].values()
    del entry["jwksUrl"]
    return json.dumps(parsed, separators=(",", ":")).encode()


def test_a_notice_naming_no_jwks_or_another_jwks_is_refused(tmp_path, key_a):
    other = "https://elsewhere.example/.well-known/jwks.json"
    unnamed = without_jwks_url(notice_body(from_seq=2))
    got = post_all(
        tmp_path, key_a, [status_body(), unnamed, notice_body(from_seq=3, jwksUrl=other)]
    )
    assert [a["status"] for a in got] == [200, 400, 400]
    assert "names no jwksUrl" in got[1]["reason"]
    assert other in got[2]["reason"]
    assert JWKS_URL in got[2]["reason"]


def test_a_delivery_that_does_not_verify_is_refused(tmp_path, key_a):
    verifier_key = ("kid-a", Ed25519PrivateKey.generate())  # another key under the same kid
    verifier = WebhookVerifier(jwks_url=JWKS_URL, jwks=jwks(verifier_key), clock=lambda: NOW)
    sent = Sender([key_a]).deliver(body=status_body(), binding_version=V1)

    async def go() -> int:
        app = make_app(answers.Recorder(tmp_path / "r.jsonl"), verifier, "channels")
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/hooks/v1/task-0", data=sent.body, headers=sent.headers)
            return resp.status

    assert asyncio.run(go()) == 401
