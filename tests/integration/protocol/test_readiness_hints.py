"""A never-ready instance says what to start (issue 18): the queue no worker consumes, or that
no heartbeat ever arrived (beat may be missing), in `/readyz` and in the card's 503 body.

The rows are what real workers write (agents.readiness.worker_started / heartbeat, the calls
the worker's start-up signal and the heartbeat job make); the processes themselves are in
tests/integration/agents/test_plain_commands.py."""

from __future__ import annotations

import pytest

from agents import readiness
from tests.factories import AgentFactory
from tests.integration.protocol.conftest import Wire
from tests.readiness_helpers import readiness_reset

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def wire():
    readiness_reset()
    AgentFactory(slug="ops", is_default=True, executor="echo")
    yield Wire()
    readiness_reset()


def failing(wire: Wire) -> tuple[dict, dict]:
    """The failing checks as /readyz and the card's 503 body give them."""
    readiness_reset()
    ready = wire.request("GET", "/readyz")
    assert ready.status_code == 503, ready.text
    from_readyz = {k: v["detail"] for k, v in ready.json()["checks"].items() if not v["ok"]}
    readiness_reset()
    card = wire.request("GET", "/.well-known/agent-card.json")
    assert card.status_code == 503, card.text
    return from_readyz, card.json()["failing"]


def test_no_worker_at_all_names_the_queues_and_the_command(wire):
    for body in failing(wire):
        assert body["agents_worker"].startswith("no worker consumes `agents`")
        assert body["delivery_worker"].startswith("no worker consumes `webhooks`")
        assert "celery -A a2a_platform worker" in body["agents_worker"]


def test_a_worker_on_agents_only_names_webhooks_and_heartbeat(wire):
    """`celery worker -Q agents`: nothing consumes the webhooks, nor the heartbeat that would
    prove the agents worker live."""
    readiness.worker_started(hostname="w1", queues=["agents"], backlog_reenqueued=True)
    for body in failing(wire):
        assert body["agents_worker"].startswith("no worker consumes `heartbeat`")
        assert body["delivery_worker"].startswith("no worker consumes `webhooks`")


def test_workers_that_never_got_a_heartbeat_say_beat_may_be_missing(wire):
    readiness.worker_started(
        hostname="w1", queues=["agents", "heartbeat", "webhooks"], backlog_reenqueued=True
    )
    for body in failing(wire):
        for check in ("agents_worker", "delivery_worker"):
            assert "no heartbeat has ever arrived" in body[check]
            assert "beat may be missing: `celery -A a2a_platform beat`" in body[check]


def test_a_heartbeat_gone_stale_is_not_blamed_on_beat(wire, settings):
    """A worker that did beat, then stopped: the heartbeat is stale, beat is not the suspect."""
    readiness.worker_started(
        hostname="w1", queues=["agents", "heartbeat", "webhooks"], backlog_reenqueued=True
    )
    readiness.heartbeat(hostname="w1")
    settings.A2A_HEARTBEAT_FRESH_SECONDS = -1  # the beat just written is already stale
    for body in failing(wire):
        assert body["agents_worker"] == "no worker consuming `agents` has a fresh heartbeat"
        assert "beat may be missing" not in body["delivery_worker"]
