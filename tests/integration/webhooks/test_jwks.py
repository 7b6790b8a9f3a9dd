"""The JWKS receivers verify deliveries with, served by the protocol app (in process).

The default agent is also served at the origin root, so its JWKS is at `/.well-known/jwks.json`
as well as at `/<slug>/.well-known/jwks.json`: the same document, the agent's live keys.
"""

from __future__ import annotations

import pytest

from agents.signing import jwks, signing_key_retire, signing_key_rotate
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = "/.well-known/jwks.json"


def served(wire, path: str) -> dict:
    response = wire.request("GET", path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/jwk-set+json")
    return response.json()


def kids(document: dict) -> list[str]:
    return [key["kid"] for key in document["keys"]]


def test_jwks_of_the_default_agent_is_served_at_the_root_as_at_its_tenant_path(wire, agent):
    other = AgentFactory(slug="not-default", executor="external")
    tenant_path = f"/{agent.slug}/.well-known/jwks.json"

    root = served(wire, ROOT)
    assert root == served(wire, tenant_path) == jwks(agent)
    assert len(root["keys"]) == 1  # the key it was created with
    assert root["keys"][0]["kty"] == "OKP"
    assert root["keys"][0]["crv"] == "Ed25519"
    # Another agent has keys of its own, served at its path only.
    elsewhere = served(wire, f"/{other.slug}/.well-known/jwks.json")
    assert elsewhere == jwks(other)
    assert not set(kids(elsewhere)) & set(kids(root))

    # A rotation publishes both live keys at both paths; retiring the old one removes it.
    old_kid = kids(root)[0]
    new = signing_key_rotate(agent=agent)
    rotating = served(wire, ROOT)
    assert kids(rotating) == [new.kid, old_kid]
    assert rotating == served(wire, tenant_path) == jwks(agent)
    signing_key_retire(key_id=agent.signing_keys.get(kid=old_kid).pk, actor="test")
    assert kids(served(wire, ROOT)) == kids(served(wire, tenant_path)) == [new.kid]
