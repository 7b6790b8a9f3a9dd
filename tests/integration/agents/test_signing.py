"""Agent signing keys (agents.signing) against the real database."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization
from django.db import IntegrityError, connection, transaction

from agents.models import SigningKey, SigningKeyState
from agents.signing import (
    SigningKeyError,
    jwks,
    live_private_keys,
    live_signing_keys,
    private_key,
    signing_key_create,
    signing_key_retire,
    signing_key_rotate,
)
from tests.factories import AgentFactory
from webhooks.delivery import signer
from webhooks.receiver import WebhookVerifier

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(db):
    """A keyless agent (as one made outside the services would be): these tests write its
    keys themselves, from the first."""
    return AgentFactory(signing_key=False)


def raw_private(key: SigningKey) -> bytes:
    return private_key(key).private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def test_signing_key_create_first_key_is_active(agent):
    key = signing_key_create(agent=agent)
    assert key.state == SigningKeyState.ACTIVE
    assert key.algorithm == "EdDSA"
    assert len(base64.urlsafe_b64decode(key.public_key + "=")) == 32
    assert len(key.kid) >= 16
    assert key.retiring_since is None
    assert key.retired_at is None
    # The stored public key is the private key's own.
    public = (
        private_key(key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    assert base64.urlsafe_b64encode(public).decode().rstrip("=") == key.public_key


def test_signing_key_create_refuses_a_second_active_key(agent):
    signing_key_create(agent=agent)
    with pytest.raises(SigningKeyError, match="rotate"):
        signing_key_create(agent=agent)
    assert SigningKey.objects.filter(agent=agent).count() == 1


def test_signing_key_single_active_constraint_backs_the_services(agent):
    key = signing_key_create(agent=agent)
    duplicate = SigningKey(
        agent=agent,
        public_key=key.public_key,
        private_key_encrypted=key.private_key_encrypted,
        state=SigningKeyState.ACTIVE,
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        duplicate.save()


def test_signing_key_kids_are_unique_across_agents():
    kids = {signing_key_create(agent=AgentFactory(signing_key=False)).kid for _ in range(5)}
    assert len(kids) == 5


def test_signing_key_rotate_keeps_the_old_key_signing(agent):
    old = signing_key_create(agent=agent)
    new = signing_key_rotate(agent=agent)
    old.refresh_from_db()
    assert new.state == SigningKeyState.ACTIVE
    assert old.state == SigningKeyState.RETIRING
    assert old.retiring_since is not None
    assert old.retired_at is None
    assert [k.kid for k in live_signing_keys(agent)] == [new.kid, old.kid]
    assert [kid for kid, _ in live_private_keys(agent)] == [new.kid, old.kid]


def test_signing_key_rotate_without_a_key_creates_one(agent):
    key = signing_key_rotate(agent=agent)
    assert key.state == SigningKeyState.ACTIVE
    assert live_signing_keys(agent) == [key]


def test_signing_key_retire_removes_it_from_signing_and_the_jwks(agent):
    old = signing_key_create(agent=agent)
    new = signing_key_rotate(agent=agent)
    retired = signing_key_retire(key_id=old.pk, actor="test")
    assert retired.state == SigningKeyState.RETIRED
    assert retired.retired_at is not None
    assert live_signing_keys(agent) == [new]
    assert [k["kid"] for k in jwks(agent)["keys"]] == [new.kid]
    # Idempotent.
    again = signing_key_retire(key_id=old.pk, actor="test")
    assert again.retired_at == retired.retired_at


def test_signing_key_retire_refuses_the_active_key(agent):
    key = signing_key_create(agent=agent)
    with pytest.raises(SigningKeyError, match="rotate"):
        signing_key_retire(key_id=key.pk, actor="test")
    key.refresh_from_db()
    assert key.state == SigningKeyState.ACTIVE


def test_signing_key_several_rotations_keep_every_unretired_key_live(agent):
    first = signing_key_create(agent=agent)
    second = signing_key_rotate(agent=agent)
    third = signing_key_rotate(agent=agent)
    states = {k.kid: k.state for k in SigningKey.objects.filter(agent=agent)}
    assert states == {
        first.kid: SigningKeyState.RETIRING,
        second.kid: SigningKeyState.RETIRING,
        third.kid: SigningKeyState.ACTIVE,
    }
    assert [k.kid for k in live_signing_keys(agent)] == [third.kid, second.kid, first.kid]


def test_agent_factory_keys_an_agent_as_agent_create_does():
    agent = AgentFactory(signing_key=True)
    (key,) = live_signing_keys(agent)
    assert key.state == SigningKeyState.ACTIVE
    assert jwks(agent)["keys"][0]["kid"] == key.kid


def test_jwks_contents(agent):
    old = signing_key_create(agent=agent)
    new = signing_key_rotate(agent=agent)
    other = signing_key_create(agent=AgentFactory(signing_key=False))
    document = jwks(agent)
    assert document == {
        "keys": [
            {
                "kty": "OKP",
                "crv": "Ed25519",
                "x": key.public_key,
                "kid": key.kid,
                "alg": "EdDSA",
                "use": "sig",
            }
            for key in (new, old)
        ]
    }
    assert other.kid not in {k["kid"] for k in document["keys"]}
    assert jwks(AgentFactory(signing_key=False)) == {"keys": []}


def test_private_key_is_never_stored_in_clear(agent):
    key = signing_key_create(agent=agent)
    raw = raw_private(key)
    encodings = {
        base64.b64encode(raw).decode(),
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
        raw.hex(),
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT private_key_encrypted, public_key FROM agents_signingkey WHERE id = %s",
            [key.pk],
        )
        stored_private, stored_public = cursor.fetchone()
    for encoded in encodings:
        assert encoded not in stored_private
        assert encoded not in stored_public
    # And nowhere else in the row.
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM agents_signingkey WHERE id = %s", [key.pk])
        row = " ".join(str(v) for v in cursor.fetchone())
    for encoded in encodings:
        assert encoded not in row
    assert "private" not in repr(key).lower()
    assert stored_private not in str(key)


def test_signing_keys_verify_end_to_end_through_the_jwks(agent):
    """Sign as the delivery job does, verify as a client does, across a rotation."""
    signing_key_create(agent=agent)
    body = b'{"statusUpdate":{"taskId":"t-1","status":{"state":"TASK_STATE_WORKING"}}}'
    before = signer.webhook_headers(
        msg_id="evt_1", timestamp=1_750_000_000, body=body, keys=live_private_keys(agent)
    )
    client = WebhookVerifier(jwks=jwks(agent), clock=lambda: 1_750_000_000)
    assert client.verify(before, body).task_id == "t-1"

    signing_key_rotate(agent=agent)
    during = signer.webhook_headers(
        msg_id="evt_2", timestamp=1_750_000_000, body=body, keys=live_private_keys(agent)
    )
    # The client still knows only the old key: the retiring key's signature carries it.
    assert client.verify(during, body).event_id == "evt_2"
    assert len(during["webhook-signature"].split()) == 2


def test_admin_shows_signing_keys_read_only_without_the_private_key(admin_client, agent):
    key = signing_key_create(agent=agent)
    listing = admin_client.get("/admin/agents/signingkey/")
    assert listing.status_code == 200
    assert key.kid in listing.content.decode()
    page = admin_client.get(f"/admin/agents/signingkey/{key.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert key.kid in html
    assert key.private_key_encrypted not in html
    assert "private" not in html.lower()
    assert admin_client.get("/admin/agents/signingkey/add/").status_code == 403
    assert admin_client.post(f"/admin/agents/signingkey/{key.pk}/delete/").status_code == 403
