"""Fixtures shared by the webhook registration and outbox tests."""

from __future__ import annotations

import socket

import pytest
from django.contrib.auth import get_user_model

from agents.services import api_key_create
from tests.deliveries import close_client
from tests.factories import AgentFactory
from tests.integration.protocol.conftest import wire as protocol_wire  # noqa: F401 (fixture)
from webhooks.delivery import ssrf

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
def fake_dns(monkeypatch):
    """`fake_dns.answers[name]` = list of answers, one per lookup (the last one repeats; an
    empty list: the name does not resolve). Other names (the address literals the transport
    connects to, localhost) resolve for real. It patches `socket.getaddrinfo`, so every
    resolver in this process that uses it sees the answers."""
    real = socket.getaddrinfo

    class FakeDNS:
        answers: dict[str, list[list[str]]] = {}
        lookups: list[str] = []

        @staticmethod
        def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):  # noqa: A002
            if host not in FakeDNS.answers:
                return real(host, port, family, type, proto, flags)
            FakeDNS.lookups.append(host)
            queue = FakeDNS.answers[host]
            if not queue:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            addresses = queue.pop(0) if len(queue) > 1 else queue[0]
            return [
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port, 0, 0))
                if ":" in a
                else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in addresses
            ]

    FakeDNS.answers = {}
    FakeDNS.lookups = []
    monkeypatch.setattr(socket, "getaddrinfo", FakeDNS.getaddrinfo)
    return FakeDNS


@pytest.fixture
def wire(protocol_wire):  # noqa: F811 (pytest passes the imported fixture)
    """The protocol tests' in-process `wire` (tests/integration/protocol/conftest.py)."""
    return protocol_wire


@pytest.fixture
def agent(transactional_db):
    """The default agent, run by an external backend (nothing executes its tasks)."""
    return AgentFactory(slug="hooks", is_default=True, executor="external")


@pytest.fixture
def superuser(client, db):
    """The test client, signed in as a superuser (the console's pages)."""
    user = get_user_model().objects.create_superuser("admin", email="", password="x")
    client.force_login(user)
    return client


@pytest.fixture
def key(agent):
    return api_key_create(agent=agent, name="client")


@pytest.fixture
def fresh_transport():
    """This process's sender starts and ends the test with no pooled connection."""

    close_client()
    yield
    close_client()
