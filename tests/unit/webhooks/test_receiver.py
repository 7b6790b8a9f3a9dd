"""webhooks.receiver: sign with webhooks.delivery.signer, verify as an A2A client would."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from webhooks.delivery import signer
from webhooks.receiver import (
    TEST_EVENT_URI,
    ChannelTrust,
    DeliveryLedger,
    VerificationError,
    VerifiedDelivery,
    WebhookVerifier,
    parse_jwks,
)

NOW = 1_750_000_000
AUDIENCE = "https://client.example.com/hooks/a2a"
ISSUER = "https://agents.example.com/demo"
TASK = "0b7a4c2e-1111-4c1e-9d0b-6a3d2f1e0001"


def jwk(kid: str, key: Ed25519PrivateKey) -> dict:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"}


def jwks(*pairs: tuple[str, Ed25519PrivateKey]) -> dict:
    return {"keys": [jwk(kid, key) for kid, key in pairs]}


def status_body(task_id: str = TASK, state: str = "TASK_STATE_WORKING") -> bytes:
    return json.dumps(
        {"statusUpdate": {"taskId": task_id, "contextId": "c", "status": {"state": state}}},
        separators=(",", ":"),
    ).encode()


@dataclass
class Sent:
    headers: dict[str, str]
    body: bytes


@dataclass
class Sender:
    """Builds deliveries the way the platform's delivery job does."""

    keys: list[tuple[str, Ed25519PrivateKey]]
    sent: list[Sent] = field(default_factory=list)

    def deliver(
        self,
        *,
        event_id: str = "evt_1",
        seq: int | None = 1,
        body: bytes | None = None,
        timestamp: int = NOW,
        jwt: bool = False,
        jwt_kwargs: dict | None = None,
        token: str | None = None,
        binding_version: str | None = "bv-1",
        task_header: str | None = TASK,
    ) -> Sent:
        body = status_body() if body is None else body
        headers = signer.webhook_headers(
            msg_id=event_id, timestamp=timestamp, body=body, keys=self.keys
        )
        if seq is not None:
            headers["X-A2A-Task-Seq"] = str(seq)
        if binding_version is not None:
            headers["X-A2A-Binding-Version"] = binding_version
        if task_header is not None:
            headers["X-A2A-Task-Id"] = task_header
        if token is not None:
            headers["X-A2A-Notification-Token"] = token
        if jwt:
            kwargs = {
                "issuer": ISSUER,
                "audience": AUDIENCE,
                "task_id": TASK,
                "event_id": event_id,
                "body": body,
                "issued_at": timestamp,
                **(jwt_kwargs or {}),
            }
            headers["Authorization"] = "Bearer " + signer.bearer_jwt(key=self.keys[0], **kwargs)
        sent = Sent(headers=headers, body=body)
        self.sent.append(sent)
        return sent


@pytest.fixture
def key_a():
    return ("kid-a", Ed25519PrivateKey.generate())


@pytest.fixture
def key_b():
    return ("kid-b", Ed25519PrivateKey.generate())


def verifier_for(*pairs, **kw) -> WebhookVerifier:
    kw.setdefault("clock", lambda: NOW)
    return WebhookVerifier(jwks=jwks(*pairs), **kw)


def reason_of(verifier: WebhookVerifier, sent: Sent, **kw) -> str:
    with pytest.raises(VerificationError) as info:
        verifier.verify(sent.headers, sent.body, **kw)
    return info.value.reason


# --- happy path ---------------------------------------------------------------------------


def test_verify_accepts_a_signed_delivery(key_a):
    sent = Sender([key_a]).deliver(seq=3)
    delivery = verifier_for(key_a).verify(sent.headers, sent.body)
    assert delivery == VerifiedDelivery(
        event_id="evt_1",
        task_id=TASK,
        seq=3,
        binding_version="bv-1",
        timestamp=NOW,
        payload={},
        key_id="kid-a",
    )
    assert delivery.payload["statusUpdate"]["taskId"] == TASK
    assert delivery.jwt_claims is None


def test_verify_accepts_a_test_event_and_says_it_is_one(key_a):
    """The console's test send (webhooks/console/endpoint_probe.py probe_body): verified as
    any delivery, reported as a test, and no channel is learnt for its made-up task."""
    test_task = "5f0c1d2e-2222-4c1e-9d0b-6a3d2f1e0002"
    body = {
        "statusUpdate": {
            "taskId": test_task,
            "contextId": "c-test",
            "status": {"state": "TASK_STATE_UNSPECIFIED"},
            "metadata": {TEST_EVENT_URI: {"test": True, "sentBy": "ops"}},
        }
    }
    sent = Sender([key_a]).deliver(seq=0, body=json.dumps(body).encode(), task_header=test_task)
    channels = ChannelTrust()
    delivery = verifier_for(key_a).verify(sent.headers, sent.body, channels=channels)
    assert delivery.is_test
    assert (delivery.task_id, delivery.seq) == (test_task, 0)
    assert channels.task_count() == 0

    real = Sender([key_a]).deliver(seq=1)
    delivery = verifier_for(key_a).verify(real.headers, real.body, channels=channels)
    assert not delivery.is_test
    assert channels.task_count() == 1


def test_verify_reads_headers_case_insensitively(key_a):
    sent = Sender([key_a]).deliver()
    upper = {k.upper(): v for k, v in sent.headers.items()}
    assert verifier_for(key_a).verify(upper, sent.body).event_id == "evt_1"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"artifactUpdate": {"taskId": "t-art"}}, "t-art"),
        ({"task": {"id": "t-task"}}, "t-task"),
        ({"message": {"taskId": "t-msg"}}, "t-msg"),
    ],
)
def test_verify_reads_the_task_id_from_the_body(key_a, body, expected):
    raw = json.dumps(body).encode()
    sent = Sender([key_a]).deliver(body=raw, task_header=None)
    assert verifier_for(key_a).verify(sent.headers, sent.body).task_id == expected


def test_verify_task_id_falls_back_to_the_header(key_a):
    sent = Sender([key_a]).deliver(body=b'{"other": 1}', task_header="t-hdr")
    assert verifier_for(key_a).verify(sent.headers, sent.body).task_id == "t-hdr"


def test_verify_refuses_a_task_header_that_contradicts_the_signed_body(key_a):
    sent = Sender([key_a]).deliver(task_header="another-task")
    assert reason_of(verifier_for(key_a), sent) == "headers"


# --- tampering ----------------------------------------------------------------------------


def test_verify_refuses_a_tampered_body(key_a):
    sent = Sender([key_a]).deliver()
    sent.body = sent.body.replace(b"WORKING", b"COMPLETED")
    assert reason_of(verifier_for(key_a), sent) == "signature"


def test_verify_refuses_a_tampered_timestamp(key_a):
    sent = Sender([key_a]).deliver()
    sent.headers["webhook-timestamp"] = str(NOW + 1)
    assert reason_of(verifier_for(key_a), sent) == "signature"


def test_verify_refuses_a_tampered_event_id(key_a):
    sent = Sender([key_a]).deliver()
    sent.headers["webhook-id"] = "evt_2"
    assert reason_of(verifier_for(key_a), sent) == "signature"


def test_verify_refuses_a_tampered_signature(key_a):
    sent = Sender([key_a]).deliver()
    raw = bytearray(base64.b64decode(sent.headers["webhook-signature"].partition(",")[2]))
    raw[0] ^= 0x01
    sent.headers["webhook-signature"] = "v1a," + base64.b64encode(bytes(raw)).decode()
    assert reason_of(verifier_for(key_a), sent) == "signature"


def test_verify_refuses_a_signature_by_an_untrusted_key(key_a, key_b):
    sent = Sender([key_b]).deliver()
    # The kid hint names a trusted key: hints never grant trust.
    sent.headers["X-A2A-Signature-Key-Ids"] = "kid-a"
    assert reason_of(verifier_for(key_a), sent) == "signature"


def test_verify_ignores_other_schemes_and_garbage_entries(key_a):
    sent = Sender([key_a]).deliver()
    sig = sent.headers["webhook-signature"]
    sent.headers["webhook-signature"] = f"v1,AAAA v1a,@@@ v1a,{'A' * 8} {sig}"
    assert verifier_for(key_a).verify(sent.headers, sent.body).key_id == "kid-a"
    sent.headers["webhook-signature"] = "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4="
    assert reason_of(verifier_for(key_a), sent) == "signature"


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_verify_refuses_missing_headers(key_a, missing):
    sent = Sender([key_a]).deliver()
    del sent.headers[missing]
    assert reason_of(verifier_for(key_a), sent) == "headers"


@pytest.mark.parametrize("bad", ["abc", "-5", "1.5"])
def test_verify_refuses_a_malformed_timestamp(key_a, bad):
    sent = Sender([key_a]).deliver()
    sent.headers["webhook-timestamp"] = bad
    assert reason_of(verifier_for(key_a), sent) == "headers"


@pytest.mark.parametrize("offset", [-301, 301, -86_400])
def test_verify_refuses_a_stale_or_future_timestamp(key_a, offset):
    sent = Sender([key_a]).deliver(timestamp=NOW + offset)
    assert reason_of(verifier_for(key_a), sent) == "stale"


@pytest.mark.parametrize("offset", [-300, 0, 300])
def test_verify_accepts_timestamps_within_the_tolerance(key_a, offset):
    sent = Sender([key_a]).deliver(timestamp=NOW + offset)
    assert verifier_for(key_a).verify(sent.headers, sent.body).timestamp == NOW + offset


def test_verify_tolerance_is_configurable(key_a):
    sent = Sender([key_a]).deliver(timestamp=NOW - 60)
    assert reason_of(verifier_for(key_a, tolerance_seconds=30), sent) == "stale"


def test_verify_refuses_a_malformed_seq(key_a):
    sent = Sender([key_a]).deliver()
    sent.headers["X-A2A-Task-Seq"] = "two"
    assert reason_of(verifier_for(key_a), sent) == "headers"


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]"])
def test_verify_refuses_a_body_that_is_not_a_json_object(key_a, body):
    sent = Sender([key_a]).deliver(body=body)
    assert reason_of(verifier_for(key_a), sent) == "payload"


# --- rotation -----------------------------------------------------------------------------


def test_rotation_two_signatures_either_key_alone_verifies(key_a, key_b):
    # key_b is the new active key, key_a the retiring one: both sign.
    sent = Sender([key_b, key_a]).deliver()
    assert len(sent.headers["webhook-signature"].split(" ")) == 2
    assert verifier_for(key_a).verify(sent.headers, sent.body).key_id == "kid-a"
    assert verifier_for(key_b).verify(sent.headers, sent.body).key_id == "kid-b"
    assert verifier_for(key_a, key_b).verify(sent.headers, sent.body).key_id == "kid-b"


def test_rotation_without_the_kid_hint_tries_every_key(key_a, key_b):
    sent = Sender([key_b, key_a]).deliver()
    del sent.headers["X-A2A-Signature-Key-Ids"]
    assert verifier_for(key_a).verify(sent.headers, sent.body).key_id == "kid-a"


def test_rotation_unknown_key_refreshes_the_jwks_once(key_a, key_b):
    published = {"jwks": jwks(key_a)}
    calls = []

    def fetch(url):
        calls.append(url)
        return published["jwks"]

    ticks = {"now": 1000.0}
    verifier = WebhookVerifier(
        jwks_url="https://agents.example.com/.well-known/jwks.json",
        fetch=fetch,
        clock=lambda: NOW,
        monotonic=lambda: ticks["now"],
    )
    sender = Sender([key_a])
    first = sender.deliver(event_id="e1")
    assert verifier.verify(first.headers, first.body).key_id == "kid-a"
    assert len(calls) == 1  # fetched lazily, on first use

    # Minutes later the platform rotates to key_b (key_a keeps signing until retired).
    ticks["now"] += 600
    published["jwks"] = jwks(key_b, key_a)
    second = Sender([key_b]).deliver(event_id="e2")
    assert verifier.verify(second.headers, second.body).key_id == "kid-b"
    assert len(calls) == 2
    assert set(verifier.key_ids) == {"kid-a", "kid-b"}


def test_rotation_refresh_is_rate_limited(key_a, key_b):
    calls = []

    def fetch(url):
        calls.append(url)
        return jwks(key_a)

    ticks = {"now": 1000.0}
    verifier = WebhookVerifier(
        jwks_url="https://x/.well-known/jwks.json",
        fetch=fetch,
        clock=lambda: NOW,
        monotonic=lambda: ticks["now"],
    )
    forged = Sender([key_b])
    for n in range(5):
        sent = forged.deliver(event_id=f"e{n}")
        assert reason_of(verifier, sent) == "signature"
        ticks["now"] += 10
    # The initial fetch only: forged deliveries cannot make the verifier hammer the JWKS.
    assert len(calls) == 1
    ticks["now"] += 60
    assert reason_of(verifier, forged.deliver(event_id="e9")) == "signature"
    assert len(calls) == 2  # at most one refresh per min_refresh_seconds (60 s)


def test_rotation_refresh_drops_retired_keys(key_a, key_b):
    published = {"jwks": jwks(key_a, key_b)}
    verifier = WebhookVerifier(
        jwks_url="https://x/jwks.json",
        fetch=lambda url: published["jwks"],
        clock=lambda: NOW,
        min_refresh_seconds=0,
    )
    sent = Sender([key_a]).deliver()
    assert verifier.verify(sent.headers, sent.body).key_id == "kid-a"
    published["jwks"] = jwks(key_b)  # key_a retired
    assert verifier.refresh()
    assert reason_of(verifier, sent) == "signature"


def test_jwks_answer_without_keys_does_not_wipe_the_trusted_set(key_a):
    answers = iter([jwks(key_a), {"error": "bad gateway"}])
    verifier = WebhookVerifier(
        jwks_url="https://x/jwks.json",
        fetch=lambda url: next(answers),
        clock=lambda: NOW,
        min_refresh_seconds=0,
    )
    sent = Sender([key_a]).deliver()
    verifier.verify(sent.headers, sent.body)
    assert verifier.refresh() is False
    assert verifier.key_ids == ("kid-a",)


def test_jwks_fetch_failure_without_cached_keys_is_a_jwks_error(key_a):
    def fetch(url):
        raise OSError("connection refused")

    verifier = WebhookVerifier(jwks_url="https://x/jwks.json", fetch=fetch, clock=lambda: NOW)
    sent = Sender([key_a]).deliver()
    assert reason_of(verifier, sent) == "jwks"


def test_jwks_fetch_failure_keeps_the_cached_keys(key_a):
    state = {"fail": False}

    def fetch(url):
        if state["fail"]:
            raise OSError("down")
        return jwks(key_a)

    verifier = WebhookVerifier(
        jwks_url="https://x/jwks.json", fetch=fetch, clock=lambda: NOW, min_refresh_seconds=0
    )
    sent = Sender([key_a]).deliver()
    verifier.verify(sent.headers, sent.body)
    state["fail"] = True
    assert verifier.refresh() is False
    assert verifier.verify(sent.headers, sent.body).key_id == "kid-a"


def test_parse_jwks_skips_foreign_and_malformed_keys(key_a):
    good = jwk(*key_a)
    parsed = parse_jwks(
        {
            "keys": [
                good,
                {**good, "kid": "rsa", "kty": "RSA"},
                {**good, "kid": "p256", "crv": "P-256"},
                {**good, "kid": "enc", "use": "enc"},
                {**good, "kid": "short", "x": "AAAA"},
                {**good, "kid": ""},
                "not a dict",
            ]
        }
    )
    assert list(parsed) == ["kid-a"]
    assert parse_jwks({"keys": "nope"}) == {}


def test_verifier_needs_a_key_source():
    with pytest.raises(ValueError, match="jwks"):
        WebhookVerifier()


# --- JWT ----------------------------------------------------------------------------------


def test_jwt_valid_token_is_verified(key_a):
    sent = Sender([key_a]).deliver(jwt=True, jwt_kwargs={"seq": 1, "binding_version": "bv-1"})
    delivery = verifier_for(key_a).verify(sent.headers, sent.body, expected_audience=AUDIENCE)
    assert delivery.jwt_claims["jti"] == "evt_1"
    assert delivery.jwt_claims["taskId"] == TASK
    assert delivery.seq == 1
    assert delivery.binding_version == "bv-1"


def test_jwt_wrong_audience(key_a):
    sent = Sender([key_a]).deliver(jwt=True)
    verifier = verifier_for(key_a)
    assert reason_of(verifier, sent, expected_audience="https://evil.example.com/") == "jwt"


def test_jwt_wrong_issuer(key_a):
    sent = Sender([key_a]).deliver(jwt=True)
    verifier = verifier_for(key_a)
    assert reason_of(verifier, sent, expected_issuer="https://other.example.com") == "jwt"


def test_jwt_expired(key_a):
    # Signed at NOW - 200 with a 60 s lifetime: the webhook timestamp is still fresh,
    # the JWT is not (30 s leeway).
    sent = Sender([key_a]).deliver(timestamp=NOW - 200, jwt=True, jwt_kwargs={"ttl_seconds": 60})
    with pytest.raises(VerificationError, match="expired") as info:
        verifier_for(key_a).verify(sent.headers, sent.body, expected_audience=AUDIENCE)
    assert info.value.reason == "jwt"


def test_jwt_issued_in_the_future(key_a):
    sent = Sender([key_a]).deliver(jwt=True, jwt_kwargs={"issued_at": NOW + 120})
    with pytest.raises(VerificationError, match="future") as info:
        verifier_for(key_a).verify(sent.headers, sent.body, expected_audience=AUDIENCE)
    assert info.value.reason == "jwt"


def test_jwt_body_hash_mismatch(key_a):
    # A JWT minted for another body, re-attached to a correctly signed delivery.
    sent = Sender([key_a]).deliver(jwt=True, jwt_kwargs={"body": b'{"other": true}'})
    with pytest.raises(VerificationError, match="bodySha256") as info:
        verifier_for(key_a).verify(sent.headers, sent.body, expected_audience=AUDIENCE)
    assert info.value.reason == "jwt"


def test_jwt_for_another_event(key_a):
    sent = Sender([key_a]).deliver(jwt=True, jwt_kwargs={"event_id": "evt_other"})
    assert reason_of(verifier_for(key_a), sent, expected_audience=AUDIENCE) == "jwt"


def test_jwt_for_another_task(key_a):
    sent = Sender([key_a]).deliver(jwt=True, jwt_kwargs={"task_id": "other-task"})
    assert reason_of(verifier_for(key_a), sent, expected_audience=AUDIENCE) == "jwt"


def test_jwt_seq_must_match_the_header(key_a):
    sent = Sender([key_a]).deliver(seq=5, jwt=True, jwt_kwargs={"seq": 4})
    assert reason_of(verifier_for(key_a), sent, expected_audience=AUDIENCE) == "jwt"


def test_jwt_binding_version_must_match_the_header(key_a):
    sent = Sender([key_a]).deliver(jwt=True, jwt_kwargs={"binding_version": "bv-9"})
    assert reason_of(verifier_for(key_a), sent, expected_audience=AUDIENCE) == "jwt"


def test_jwt_signed_by_an_untrusted_kid(key_a, key_b):
    sent = Sender([key_a]).deliver()
    token = signer.bearer_jwt(
        key=key_b,
        issuer=ISSUER,
        audience=AUDIENCE,
        task_id=TASK,
        event_id="evt_1",
        body=sent.body,
        issued_at=NOW,
    )
    sent.headers["Authorization"] = f"Bearer {token}"
    assert reason_of(verifier_for(key_a), sent, expected_audience=AUDIENCE) == "jwt"


def test_jwt_forged_with_a_trusted_kid(key_a, key_b):
    # Signed by key_b but claiming key_a's kid.
    sent = Sender([key_a]).deliver()
    token = signer.bearer_jwt(
        key=("kid-a", key_b[1]),
        issuer=ISSUER,
        audience=AUDIENCE,
        task_id=TASK,
        event_id="evt_1",
        body=sent.body,
        issued_at=NOW,
    )
    sent.headers["Authorization"] = f"Bearer {token}"
    assert reason_of(verifier_for(key_a), sent, expected_audience=AUDIENCE) == "jwt"


def test_jwt_tampered_token(key_a):
    sent = Sender([key_a]).deliver(jwt=True)
    head, payload, sig = sent.headers["Authorization"].removeprefix("Bearer ").split(".")
    sig = ("A" if sig[0] != "A" else "B") + sig[1:]
    sent.headers["Authorization"] = f"Bearer {head}.{payload}.{sig}"
    assert reason_of(verifier_for(key_a), sent, expected_audience=AUDIENCE) == "jwt"


def test_jwt_opaque_bearer_credentials_are_left_to_the_application(key_a):
    sent = Sender([key_a]).deliver()
    sent.headers["Authorization"] = "Bearer client-registered-opaque-token"
    assert verifier_for(key_a).verify(sent.headers, sent.body).jwt_claims is None


# --- notification token -------------------------------------------------------------------


def test_token_matches(key_a):
    sent = Sender([key_a]).deliver(token="s3cret")
    assert verifier_for(key_a).verify(sent.headers, sent.body, expected_token="s3cret")


@pytest.mark.parametrize("token", [None, "wrong", ""])
def test_token_mismatch_or_missing(key_a, token):
    sent = Sender([key_a]).deliver(token=token)
    assert reason_of(verifier_for(key_a), sent, expected_token="s3cret") == "token"


# --- ledger -------------------------------------------------------------------------------


def delivery(event_id: str, seq: int | None, task_id: str | None = TASK, bv: str = "bv-1"):
    return VerifiedDelivery(
        event_id=event_id,
        task_id=task_id,
        seq=seq,
        binding_version=bv,
        timestamp=NOW,
        payload={},
    )


def test_ledger_dedupes_by_event_id(key_a):
    verifier, ledger = verifier_for(key_a), DeliveryLedger()
    sender = Sender([key_a])
    first = sender.deliver(event_id="evt_1", timestamp=NOW - 10)
    retry = sender.deliver(event_id="evt_1", timestamp=NOW)  # a retry: new timestamp
    assert ledger.accept(verifier.verify(first.headers, first.body)) is True
    assert ledger.accept(verifier.verify(retry.headers, retry.body)) is False


def test_ledger_staleness_by_seq():
    ledger = DeliveryLedger()
    assert ledger.accept(delivery("e3", 3))
    assert not ledger.is_stale(TASK, 3)
    # A late, older update: accepted once (it is a new event) but stale.
    assert ledger.accept(delivery("e2", 2))
    assert ledger.is_stale(TASK, 2)
    assert ledger.highest_seq(TASK) == 3
    assert ledger.accept(delivery("e4", 4))
    assert ledger.is_stale(TASK, 3)
    assert not ledger.is_stale(TASK, 4)
    assert not ledger.is_stale(TASK, 5)
    # Other tasks and unsequenced deliveries are never stale.
    assert not ledger.is_stale("other", 1)
    assert not ledger.is_stale(TASK, None)


def test_ledger_check_before_accept_gives_the_same_answer():
    ledger = DeliveryLedger()
    ledger.accept(delivery("e5", 5))
    assert ledger.is_stale(TASK, 4)
    assert not ledger.is_stale(TASK, 6)
    assert ledger.accept(delivery("e6", 6))
    assert not ledger.is_stale(TASK, 6)


def test_ledger_keeps_binding_versions_per_task():
    ledger = DeliveryLedger()
    ledger.accept(delivery("e1", 1, bv="bv-1"))
    ledger.accept(delivery("e2", 2, bv="bv-2"))
    ledger.accept(delivery("e3", 3, bv="bv-1"))
    ledger.accept(delivery("x1", 1, task_id="other", bv="bv-7"))
    assert ledger.binding_versions(TASK) == ("bv-1", "bv-2")
    assert ledger.binding_versions("other") == ("bv-7",)
    ledger.forget_task(TASK)
    assert ledger.binding_versions(TASK) == ()
    assert ledger.highest_seq(TASK) is None


def test_ledger_is_bounded():
    ledger = DeliveryLedger(max_events=2)
    assert ledger.accept(delivery("e1", 1))
    assert ledger.accept(delivery("e2", 2))
    assert ledger.accept(delivery("e3", 3))
    assert not ledger.accept(delivery("e3", 3))
    # The oldest id fell out of the window.
    assert ledger.accept(delivery("e1", 1))


def test_receiver_module_has_no_django_dependency():
    import subprocess
    import sys

    code = (
        "import sys, webhooks.receiver; "
        "assert not [m for m in sys.modules if m == 'django' or m.startswith('django.')]"
    )
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr


def test_verify_uses_the_wall_clock_by_default(key_a):
    now = int(time.time())
    sent = Sender([key_a]).deliver(timestamp=now)
    verifier = WebhookVerifier(jwks=jwks(key_a))
    assert verifier.verify(sent.headers, sent.body).timestamp == now
