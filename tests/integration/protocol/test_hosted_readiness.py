"""Seed 1 applies to hosted code: an agent whose executor is `python:<module>:<attribute>` is
served a card only while a live worker consuming `agents` reported that its code loads (the
report the heartbeat job writes, webhooks.services.worker_heartbeat); until then its card is
503 with Retry-After, and /readyz and the dashboard name the agent, the workers and the error.
One tenant's broken code keeps back its own card, not the instance."""

from __future__ import annotations

import pytest

from tests.factories import AgentFactory
from tests.integration.protocol.conftest import Wire
from tests.readiness_helpers import readiness_reset
from webhooks.console.dashboard import dashboard_data
from webhooks.services import worker_heartbeat

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ["agents", "heartbeat", "webhooks"]
BROKEN = "python:no_such_module:X"
GOOD = "python:tests.hosted_agents:QuietExecutor"


def beat() -> None:
    """The heartbeat job's write for the worker `wire` made live (tests/readiness_helpers)."""
    assert not worker_heartbeat(hostname="test-worker", queues=QUEUES)  # a beat, no re-register
    readiness_reset()


def card(wire: Wire, slug: str):
    return wire.request("GET", f"/{slug}/.well-known/agent-card.json")


def test_an_agent_whose_code_no_worker_can_load_gets_no_card(wire):
    AgentFactory(slug="broken", executor=BROKEN)
    beat()
    answer = card(wire, "broken")
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"]
    why = answer.json()["failing"]["hosted_executor"]
    assert why.startswith(f"{BROKEN}: no live worker can load it")
    assert "test-worker: ModuleNotFoundError: No module named 'no_such_module'" in why

    ready = wire.request("GET", "/readyz")
    assert ready.status_code == 200, ready.text  # the instance serves the other agents
    hosted = ready.json()["hosted"][BROKEN]
    assert (hosted["ok"], hosted["agents"], hosted["loadsOn"]) == (False, ["broken"], [])
    assert hosted["failsOn"]["test-worker"].startswith("ModuleNotFoundError")

    data = dashboard_data(sections=frozenset())
    row = next(a for a in data["agents"] if a["slug"] == "broken")
    assert not row["cardServable"]
    assert "ModuleNotFoundError" in row["card"]
    check = next(c for c in data["readiness"]["checks"] if c["name"] == f"hosted {BROKEN}")
    assert not check["ok"]
    assert "agents broken: no live worker can load it" in check["detail"]
    assert "test-worker: ModuleNotFoundError" in check["detail"]


def test_an_agent_is_not_served_before_a_worker_reported_its_code(wire):
    AgentFactory(slug="new", executor=GOOD)
    readiness_reset()  # the worker's last report predates the agent
    answer = card(wire, "new")
    assert answer.status_code == 503, answer.text
    assert "has reported loading it yet" in answer.json()["failing"]["hosted_executor"]


def test_an_agent_whose_code_a_live_worker_loads_is_served(wire):
    AgentFactory(slug="quiet", executor=GOOD)
    AgentFactory(slug="plain", executor="echo")
    beat()
    answer = card(wire, "quiet")
    assert answer.status_code == 200, answer.text
    assert answer.json()["name"]
    assert card(wire, "plain").status_code == 200
    hosted = wire.request("GET", "/readyz").json()["hosted"][GOOD]
    assert (hosted["ok"], hosted["loadsOn"]) == (True, ["test-worker"])


def test_a_report_from_a_stale_worker_does_not_count(wire, settings):
    AgentFactory(slug="quiet", executor=GOOD)
    beat()
    settings.A2A_HEARTBEAT_FRESH_SECONDS = -1  # the beat just written is already stale
    readiness_reset()
    assert card(wire, "quiet").status_code == 503
