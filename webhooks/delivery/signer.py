"""Sign webhook deliveries: Standard Webhooks `v1a` (Ed25519) headers and an EdDSA push JWT.

Pure functions over the exact bytes sent; keys come from the caller (agents.signing
`live_private_keys(agent)`), newest first.

Standard Webhooks 1.0 ("Signature scheme", "Webhook headers"): the signed content is
`{webhook-id}.{webhook-timestamp}.{body}`; an asymmetric signature is serialized as `v1a,`
followed by the standard (padded) base64 of the 64-byte Ed25519 signature; the
`webhook-signature` header is a space-separated list so a producer can sign with the current
and the previous key during a rotation, and a consumer accepts if any entry verifies. The
spec's example header carries `v1a,hnO3f9T8…` for a published key; tests/unit/webhooks/
test_signer.py reproduces it byte for byte.

`v1a` signatures carry no key id, so `X-A2A-Signature-Key-Ids` lists the kids in signature
order: receivers use it to pick the key first and to notice a kid they have not fetched yet.
It is a hint, never a trust anchor (trust comes from the receiver's own JWKS).
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Sequence

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SCHEME = "v1a"
HEADER_ID = "webhook-id"
HEADER_TIMESTAMP = "webhook-timestamp"
HEADER_SIGNATURE = "webhook-signature"
HEADER_KEY_IDS = "X-A2A-Signature-Key-Ids"

KeyPair = tuple[str, Ed25519PrivateKey]


def signature_base(msg_id: str, timestamp: int, body: bytes) -> bytes:
    """The signed content: `{msg_id}.{timestamp}.` followed by the body bytes, unchanged."""
    # Standard Webhooks: id and timestamp must not contain "." (else two (id, ts, body)
    # triples could share one signed string).
    if not msg_id or "." in msg_id:
        raise ValueError("webhook id must be non-empty and contain no '.'")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError("webhook timestamp must be a non-negative integer (Unix seconds)")
    return f"{msg_id}.{timestamp}.".encode() + body


def sign_v1a(private_key: Ed25519PrivateKey, msg_id: str, timestamp: int, body: bytes) -> str:
    """One `v1a,<base64>` signature entry."""
    signature = private_key.sign(signature_base(msg_id, timestamp, body))
    return f"{SCHEME},{base64.b64encode(signature).decode('ascii')}"


def webhook_headers(
    *, msg_id: str, timestamp: int, body: bytes, keys: Sequence[KeyPair]
) -> dict[str, str]:
    """Standard Webhooks headers signed with every live key (one `v1a` entry per key)."""
    if not keys:
        raise ValueError("at least one signing key is required")
    return {
        HEADER_ID: msg_id,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_SIGNATURE: " ".join(
            sign_v1a(private, msg_id, timestamp, body) for _, private in keys
        ),
        HEADER_KEY_IDS: " ".join(kid for kid, _ in keys),
    }


def body_sha256(body: bytes) -> str:
    """base64url (unpadded) SHA-256 of the exact body: the JWT's `bodySha256` claim."""
    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode("ascii")


def bearer_jwt(
    *,
    key: KeyPair,
    issuer: str,
    audience: str,
    task_id: str,
    event_id: str,
    body: bytes,
    ttl_seconds: int = 300,
    issued_at: int | None = None,
    seq: int | None = None,
    binding_version: str | None = None,
) -> str:
    """An EdDSA JWT for `Authorization: Bearer`, bound to this event and body.

    Claims: iss, aud, iat, exp (iat + ttl), jti (= event id = webhook-id), taskId, and
    bodySha256; `seq` and `bindingVersion` when given, so a receiver can check the
    X-A2A-Task-Seq / X-A2A-Binding-Version headers, which the webhook signature does not
    cover. Header: alg EdDSA, typ JWT, kid.
    """
    kid, private = key
    iat = int(time.time()) if issued_at is None else issued_at
    claims: dict[str, object] = {
        "iss": issuer,
        "aud": audience,
        "iat": iat,
        "exp": iat + ttl_seconds,
        "jti": event_id,
        "taskId": task_id,
        "bodySha256": body_sha256(body),
    }
    if seq is not None:
        claims["seq"] = seq
    if binding_version is not None:
        claims["bindingVersion"] = binding_version
    return jwt.encode(claims, private, algorithm="EdDSA", headers={"kid": kid, "typ": "JWT"})
