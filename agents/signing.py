"""Agent signing keys: Ed25519 keys that sign webhook deliveries and push JWTs, and the JWKS.

Lifecycle: `active` (signs; one per agent) → `retiring` (after a rotation: still signs and
stays in the JWKS, so receivers that only know it keep verifying — DESIGN.md invariant 3,
drain) → `retired` (gone from signatures and the JWKS). Writes lock the agent row, so two
rotations of one agent serialize; the partial unique constraint backs that up. Create, rotate
and retire are outermost transactions (durable). Reads (the card, the JWKS, delivery signing)
never create a key: agents get their first with the agent (`agent_create`).

The private key is stored as `a2a_platform.lib.crypto.encrypt(base64url(raw 32 bytes))`; it is
decrypted only by `private_key()`, for signing, and never logged or returned on read.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import transaction
from django.utils import timezone

from a2a_platform.lib import crypto
from agents.models import Agent, OperatorAction, SigningKey, SigningKeyState

logger = logging.getLogger(__name__)

LIVE_STATES = (SigningKeyState.ACTIVE, SigningKeyState.RETIRING)
# What the JWKS lists: the signing keys and a rebind's next key, published before it signs.
PUBLISHED_STATES = (SigningKeyState.PUBLISHED, *LIVE_STATES)


class SigningKeyError(Exception):
    """A signing-key operation that would break signing (an operator's mistake)."""


def b64url_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _lock_agent(agent: Agent) -> Agent:
    """The agent row locked for its key operations: FOR NO KEY UPDATE, which serialises them
    without blocking the key checks of rows that name the agent (a SendMessage's task), so a
    rebind that rotates the key and then locks tasks cannot deadlock with a send."""
    return Agent.objects.select_for_update(no_key=True).get(pk=agent.pk)


def _new_key(agent: Agent, state: str = SigningKeyState.ACTIVE) -> SigningKey:
    private = Ed25519PrivateKey.generate()
    raw_private = private.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    raw_public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return SigningKey.objects.create(
        agent=agent,
        public_key=b64url_encode(raw_public),
        private_key_encrypted=crypto.encrypt(b64url_encode(raw_private)),
        state=state,
    )


def _active_key(agent: Agent) -> SigningKey | None:
    return SigningKey.objects.filter(agent=agent, state=SigningKeyState.ACTIVE).first()


def active_signing_key(agent: Agent) -> SigningKey | None:
    """The agent's active key, or None (read only: keys are created with their agent,
    `agent_create`, or by migration 0006 for older agents; never on a read)."""
    return _active_key(agent)


def signing_key_create_for_new_agent(agent: Agent) -> SigningKey:
    """Inside the transaction that creates `agent`: its first key, active."""
    key = _new_key(agent)
    logger.info("signing_key.created", extra={"agent": agent.slug, "kid": key.kid})
    return key


def signing_key_create(*, agent: Agent) -> SigningKey:
    """Create the agent's first signing key, active.

    Refuses when the agent already has an active key: replacing it is a rotation
    (`signing_key_rotate`), which keeps the old key signing until it is retired.
    """
    with transaction.atomic(durable=True):
        _lock_agent(agent)
        if _active_key(agent) is not None:
            raise SigningKeyError(
                f"agent {agent.slug!r} already has an active signing key; rotate it instead"
            )
        key = _new_key(agent)
    logger.info("signing_key.created", extra={"agent": agent.slug, "kid": key.kid})
    return key


def signing_key_rotate(*, agent: Agent) -> SigningKey:
    """Make a new active key; the previous active key becomes `retiring`.

    Side effects: the retiring key keeps signing (a second `v1a` signature) and stays in the
    JWKS until `signing_key_retire`. With no active key, this just creates one.
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        _lock_agent(agent)
        previous = _active_key(agent)
        if previous is not None:
            # Demote first: the single-active constraint is checked per statement.
            previous.state = SigningKeyState.RETIRING
            previous.retiring_since = now
            previous.save(update_fields=["state", "retiring_since"])
        key = _new_key(agent)
    logger.info(
        "signing_key.rotated",
        extra={
            "agent": agent.slug,
            "kid": key.kid,
            "retiring_kid": previous.kid if previous else None,
        },
    )
    return key


def signing_key_retire(*, key_id: int, actor: str) -> SigningKey:
    """Retire a retiring key: it stops signing and leaves the JWKS. Idempotent; audited once
    (`retire_signing_key`), in the retirement's transaction.

    The active key cannot be retired directly (the agent would have nothing to sign with):
    rotate first, then retire the key that became `retiring`.
    """
    now = timezone.now()
    with transaction.atomic(durable=True):
        key = SigningKey.objects.select_for_update().get(pk=key_id)
        if key.state == SigningKeyState.RETIRED:
            return key
        if key.state == SigningKeyState.ACTIVE:
            raise SigningKeyError(f"key {key.kid} is the active key; rotate before retiring it")
        key.state = SigningKeyState.RETIRED
        key.retired_at = now
        key.save(update_fields=["state", "retired_at"])
        OperatorAction.record(actor, "retire_signing_key", {"agent": key.agent_id, "kid": key.kid})
    logger.info("signing_key.retired", extra={"agent_id": key.agent_id, "kid": key.kid})
    return key


def live_signing_keys(agent: Agent) -> list[SigningKey]:
    """Active and retiring keys, newest first: the keys that sign and that the JWKS lists."""
    return list(
        SigningKey.objects.filter(agent=agent, state__in=LIVE_STATES).order_by("-created_at", "-id")
    )


def public_jwk(key: SigningKey) -> dict[str, str]:
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": key.public_key,
        "kid": key.kid,
        "alg": "EdDSA",
        "use": "sig",
    }


def published_signing_keys(agent: Agent) -> list[SigningKey]:
    """The keys the JWKS lists, newest first: live ones and a published next key."""
    return list(
        SigningKey.objects.filter(agent=agent, state__in=PUBLISHED_STATES).order_by(
            "-created_at", "-id"
        )
    )


def jwks(agent: Agent) -> dict[str, Any]:
    """The agent's JSON Web Key Set (RFC 7517 / RFC 8037): its live public keys and a
    rebind's next key, published before it signs (webhooks/rebinds/operations.py)."""
    return {"keys": [public_jwk(key) for key in published_signing_keys(agent)]}


def signing_key_publish(agent: Agent) -> SigningKey:
    """A new key in the JWKS that does not sign yet (`published`): a rebind's next key, made
    inside the rebind's transaction (the agent row locked). A key published earlier and never
    activated is withdrawn (retired)."""
    SigningKey.objects.filter(agent=agent, state=SigningKeyState.PUBLISHED).update(
        state=SigningKeyState.RETIRED, retired_at=timezone.now()
    )
    key = _new_key(agent, state=SigningKeyState.PUBLISHED)
    logger.info("signing_key.published", extra={"agent": agent.slug, "kid": key.kid})
    return key


def signing_key_activate(key: SigningKey) -> SigningKey | None:
    """A published key becomes the active one; the previous active key becomes `retiring`
    (it still signs and stays in the JWKS). Inside the caller's transaction (a rebind's).
    Returns the previous active key."""
    now = timezone.now()
    previous = _active_key(key.agent)
    if previous is not None:  # demote first: the single-active constraint is per statement
        previous.state, previous.retiring_since = SigningKeyState.RETIRING, now
        previous.save(update_fields=["state", "retiring_since"])
    key.state = SigningKeyState.ACTIVE
    key.save(update_fields=["state"])
    logger.info("signing_key.activated", extra={"agent_id": key.agent_id, "kid": key.kid})
    return previous


def signing_key_withdraw(key_pk: int) -> None:
    """A published key that never signed leaves the JWKS (an aborted rebind's)."""
    SigningKey.objects.filter(pk=key_pk, state=SigningKeyState.PUBLISHED).update(
        state=SigningKeyState.RETIRED, retired_at=timezone.now()
    )


def private_key(key: SigningKey) -> Ed25519PrivateKey:
    """Decrypt a key's private half, for signing. Raises crypto.SecretDecryptionError."""
    return Ed25519PrivateKey.from_private_bytes(
        b64url_decode(crypto.decrypt(key.private_key_encrypted))
    )


def live_private_keys(agent: Agent) -> list[tuple[str, Ed25519PrivateKey]]:
    """`(kid, private key)` for every live key, newest first: `webhooks.delivery.signer`'s
    `keys`."""
    return [(key.kid, private_key(key)) for key in live_signing_keys(agent)]
