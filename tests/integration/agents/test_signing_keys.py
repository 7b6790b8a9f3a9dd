"""An agent's signing key is created with the agent (agent_create, an agent added in the
admin through agent_save, migration 0006 for agents created before), never on a read: the
JWKS and the card only read it, and a keyless agent (made outside the services) is served an
empty JWKS and an unsigned card, not an error."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from a2a_platform.protocol import discovery
from agents.models import Agent, SigningKey, SigningKeyState
from agents.services import agent_create, agent_save
from agents.signing import active_signing_key, jwks, signing_key_create
from tests.factories import AgentFactory
from tests.integration.protocol.conftest import wire as protocol_wire  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def wire(protocol_wire, settings):  # noqa: F811 (pytest passes the imported fixture)
    settings.A2A_READINESS_CACHE_SECONDS = 0
    discovery._cards.clear()
    yield protocol_wire
    discovery._cards.clear()


def _active(agent: Agent) -> list[SigningKey]:
    return list(SigningKey.objects.filter(agent=agent, state=SigningKeyState.ACTIVE))


def test_agent_create_creates_the_agents_active_signing_key():
    agent = agent_create(slug="keyed", name="Keyed", description="d")
    (key,) = _active(agent)
    assert active_signing_key(agent) == key


def test_agent_save_creates_a_key_for_an_added_agent_only():
    agent = Agent(slug="added", name="Added", description="d")
    agent_save(agent=agent, actor="test")
    (key,) = _active(agent)
    agent.name = "Edited"
    agent_save(agent=agent, actor="test")
    assert _active(agent) == [key]


def test_migration_0006_keys_the_keyless_agents_once():
    migration = importlib.import_module("agents.migrations.0006_signing_keys_for_existing_agents")
    keyless = AgentFactory(signing_key=False)
    keyed = AgentFactory()
    (existing,) = _active(keyed)
    migration.create_missing_keys(apps, None)
    (created,) = _active(keyless)
    assert _active(keyed) == [existing]
    migration.create_missing_keys(apps, None)
    assert _active(keyless) == [created]
    assert active_signing_key(keyless).public_key == created.public_key


def test_the_jwks_of_a_keyless_agent_is_empty_and_the_read_creates_no_key(wire):
    agent = AgentFactory(slug="keyless", signing_key=False)
    response = wire.request("GET", "/keyless/.well-known/jwks.json")
    assert response.status_code == 200
    assert response.json() == {"keys": []}
    assert not SigningKey.objects.filter(agent=agent).exists()
    signing_key_create(agent=agent)
    assert wire.request("GET", "/keyless/.well-known/jwks.json").json() == jwks(agent)


def test_the_card_of_a_keyless_agent_is_served_unsigned_and_the_read_creates_no_key(wire):
    agent = AgentFactory(slug="keyless", signing_key=False)
    response = wire.request("GET", "/keyless/.well-known/agent-card.json")
    assert response.status_code == 200
    assert "signatures" not in response.json()
    assert not SigningKey.objects.filter(agent=agent).exists()
