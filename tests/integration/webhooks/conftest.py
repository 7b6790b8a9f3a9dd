"""Fixtures shared by the webhook registration and outbox tests."""

from __future__ import annotations

import pytest

from agents.services import api_key_create
from tests.factories import AgentFactory
from tests.integration.protocol.conftest import wire as protocol_wire  # noqa: F401 (fixture)
from webhooks import ssrf

# A public address the SSRF policy accepts; test host names under example.org resolve to it.
PUBLIC_V4 = "93.184.215.14"


@pytest.fixture
def public_dns(monkeypatch):
    """Host names under example.org resolve to a public address; nothing else does."""

    def resolve(host: str, port: int) -> list[str]:
        if host == "example.org" or host.endswith(".example.org"):
            return [PUBLIC_V4]
        raise ssrf.UnsafeDestination("unresolvable", f"{host} does not resolve")

    monkeypatch.setattr(ssrf, "resolve", resolve)


@pytest.fixture
def wire(protocol_wire):  # noqa: F811 (pytest passes the imported fixture)
    """The protocol tests' in-process `wire` (tests/integration/protocol/conftest.py)."""
    return protocol_wire


@pytest.fixture
def agent(transactional_db):
    """The default agent, run by an external backend (nothing executes its tasks)."""
    return AgentFactory(slug="hooks", is_default=True, executor="external")


@pytest.fixture
def key(agent):
    return api_key_create(agent=agent, name="client")
