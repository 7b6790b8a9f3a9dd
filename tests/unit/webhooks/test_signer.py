"""webhooks.delivery.signer: Standard Webhooks `v1a` headers and the push JWT, checked
independently."""

from __future__ import annotations

import base64
import hashlib
import time

import jwt
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from webhooks.delivery import signer

# Standard Webhooks 1.0 (spec/standard-webhooks.md, "Webhook headers") shows this `v1a` entry
# in its example header; it is the signature of the svix-server test vector
# (`test_asymmetric_key_signing`): the 64-byte key pair below (seed ‖ public key), message id
# msg_p5jXN8AQM9LWM0D4loKWxJek, timestamp 1614265330, body {"test": 2432232314}.
SPEC_KEYPAIR_B64 = (
    "6Xb/dCcHpPea21PS1N9VY/NZW723CEc77N4rJCubMbfVKIDij2HKpMKkioLlX0dRqSKJp4AJ6p9lMicMFs6Kvg=="
)
SPEC_PUBLIC_B64 = "1SiA4o9hyqTCpIqC5V9HUakiiaeACeqfZTInDBbOir4="
SPEC_MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = (
    "v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg=="
)


def spec_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(base64.b64decode(SPEC_KEYPAIR_B64)[:32])


def raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def test_sign_v1a_reproduces_the_published_vector():
    key = spec_key()
    assert base64.b64encode(raw_public(key)).decode() == SPEC_PUBLIC_B64
    assert signer.sign_v1a(key, SPEC_MSG_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE


def test_webhook_headers_single_key_matches_the_published_vector():
    headers = signer.webhook_headers(
        msg_id=SPEC_MSG_ID, timestamp=SPEC_TIMESTAMP, body=SPEC_BODY, keys=[("k1", spec_key())]
    )
    assert headers["webhook-id"] == SPEC_MSG_ID
    assert headers["webhook-timestamp"] == str(SPEC_TIMESTAMP)
    assert headers["webhook-signature"] == SPEC_SIGNATURE
    assert headers["X-A2A-Signature-Key-Ids"] == "k1"


def test_webhook_headers_sign_with_every_live_key_in_order():
    new, old = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    body = b'{"statusUpdate":{"taskId":"t-1"}}'
    headers = signer.webhook_headers(
        msg_id="evt_1", timestamp=1_700_000_000, body=body, keys=[("new", new), ("old", old)]
    )
    entries = headers["webhook-signature"].split(" ")
    assert len(entries) == 2
    assert headers["X-A2A-Signature-Key-Ids"] == "new old"
    signed = b"evt_1.1700000000." + body
    for entry, key in zip(entries, [new, old], strict=True):
        scheme, _, value = entry.partition(",")
        assert scheme == "v1a"
        raw = base64.b64decode(value, validate=True)  # standard alphabet, padded
        assert len(raw) == 64
        key.public_key().verify(raw, signed)  # raises if wrong


def test_webhook_headers_sign_the_exact_bytes():
    key = Ed25519PrivateKey.generate()
    body = b'{"a": 1}'
    headers = signer.webhook_headers(msg_id="e", timestamp=1, body=body, keys=[("k", key)])
    raw = base64.b64decode(headers["webhook-signature"].partition(",")[2])
    key.public_key().verify(raw, b"e.1." + body)
    with pytest.raises(InvalidSignature):
        key.public_key().verify(raw, b'e.1.{"a":1}')


@pytest.mark.parametrize("msg_id", ["", "evt.1", "."])
def test_signature_base_refuses_ids_with_a_dot(msg_id):
    with pytest.raises(ValueError, match="webhook id"):
        signer.signature_base(msg_id, 1, b"{}")


@pytest.mark.parametrize("timestamp", [-1, 1.5, "1", True])
def test_signature_base_refuses_non_integer_timestamps(timestamp):
    with pytest.raises(ValueError, match="timestamp"):
        signer.signature_base("evt", timestamp, b"{}")


def test_webhook_headers_need_a_key():
    with pytest.raises(ValueError, match="key"):
        signer.webhook_headers(msg_id="e", timestamp=1, body=b"{}", keys=[])


def test_body_sha256_is_unpadded_base64url_of_the_digest():
    body = b'{"x": "\xff"}'
    expected = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).decode().rstrip("=")
    assert signer.body_sha256(body) == expected
    assert "=" not in signer.body_sha256(body)


def test_bearer_jwt_claims_and_header_verify_independently():
    key = Ed25519PrivateKey.generate()
    body = b'{"statusUpdate":{"taskId":"task-1"}}'
    now = int(time.time())
    token = signer.bearer_jwt(
        key=("kid-1", key),
        issuer="https://agents.example.com/a1",
        audience="https://client.example.com/hook",
        task_id="task-1",
        event_id="evt_9",
        body=body,
        ttl_seconds=120,
        issued_at=now,
    )
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "EdDSA", "kid": "kid-1", "typ": "JWT"}
    claims = jwt.decode(
        token,
        key.public_key(),
        algorithms=["EdDSA"],
        audience="https://client.example.com/hook",
        issuer="https://agents.example.com/a1",
    )
    assert claims == {
        "iss": "https://agents.example.com/a1",
        "aud": "https://client.example.com/hook",
        "iat": now,
        "exp": now + 120,
        "jti": "evt_9",
        "taskId": "task-1",
        "bodySha256": base64.urlsafe_b64encode(hashlib.sha256(body).digest()).decode().rstrip("="),
    }


def test_bearer_jwt_optional_seq_and_binding_version_claims():
    key = Ed25519PrivateKey.generate()
    token = signer.bearer_jwt(
        key=("k", key),
        issuer="i",
        audience="a",
        task_id="t",
        event_id="e",
        body=b"{}",
        seq=7,
        binding_version="bv-2",
    )
    claims = jwt.decode(token, key.public_key(), algorithms=["EdDSA"], audience="a")
    assert claims["seq"] == 7
    assert claims["bindingVersion"] == "bv-2"


def test_bearer_jwt_default_lifetime_is_five_minutes():
    key = Ed25519PrivateKey.generate()
    token = signer.bearer_jwt(
        key=("k", key), issuer="i", audience="a", task_id="t", event_id="e", body=b"{}"
    )
    claims = jwt.decode(token, key.public_key(), algorithms=["EdDSA"], audience="a")
    assert claims["exp"] - claims["iat"] == 300
    assert abs(claims["iat"] - time.time()) < 5
