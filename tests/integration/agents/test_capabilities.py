"""agents.readiness.capabilities: the one rule behind the card's capabilities and the admin's
"capabilities now" (each value with its reason)."""

from __future__ import annotations

import pytest

from a2a_platform.lib.checks import Check
from agents.models import Agent
from agents.readiness import Capability, Readiness, capabilities


def _readiness(*, delivery_live: bool, hub: Check | None) -> Readiness:
    checks = [Check("database", True, "ok")] + ([hub] if hub is not None else [])
    return Readiness(checks, delivery_live=delivery_live, ever_ready=True)


def _agent(*, push: bool = True, streaming: bool = True) -> Agent:
    return Agent(slug="a", push_notifications_enabled=push, streaming_enabled=streaming)


HUB_UP = Check("event_hub", True, "connected")
HUB_DOWN = Check("event_hub", False, "not connected")


@pytest.mark.parametrize(
    ("push", "live", "expected"),
    [
        (False, True, Capability(False, "switched off by an operator")),
        (True, False, Capability(False, "no live delivery worker (see readiness)")),
        (True, True, Capability(True, "a delivery worker is live")),
    ],
)
def test_capabilities_push_needs_the_switch_and_a_live_delivery_worker(push, live, expected):
    caps = capabilities(_agent(push=push), _readiness(delivery_live=live, hub=HUB_UP))
    assert caps["pushNotifications"] == expected


@pytest.mark.parametrize(
    ("streaming", "hub", "expected"),
    [
        (False, HUB_UP, Capability(False, "switched off by an operator")),
        (True, HUB_DOWN, Capability(False, "event hub not connected")),
        (True, HUB_UP, Capability(True, "event hub connected")),
        (True, None, Capability(False, "event hub not checked")),
    ],
)
def test_capabilities_streaming_reads_the_readiness_hub_check(streaming, hub, expected):
    caps = capabilities(_agent(streaming=streaming), _readiness(delivery_live=True, hub=hub))
    assert caps["streaming"] == expected


def test_capabilities_streaming_prefers_the_callers_own_hub():
    readiness = _readiness(delivery_live=True, hub=HUB_UP)
    caps = capabilities(_agent(), readiness, hub_connected=False)
    assert caps["streaming"] == Capability(False, "event hub not connected")
    assert capabilities(_agent(streaming=False), readiness, hub_connected=True)[
        "streaming"
    ] == Capability(False, "switched off by an operator")
