"""The push-registration gate in the webhooks services (DESIGN.md invariant 1):
`push_config_gate` refuses for good when the agent's push is switched off and with a retry
hint while no delivery worker is live; `push_config_create` refuses an agent whose push is
off whoever calls it."""

from __future__ import annotations

import pytest

from agents import readiness
from tests.factories import AgentFactory, task_create, user_message
from tests.readiness_helpers import mark_workers_live, readiness_reset
from webhooks.errors import PushDeliveryUnavailable, PushNotSupported
from webhooks.models import Delivery, PushConfig
from webhooks.services import push_config_create, push_config_gate

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("public_dns")]

CONFIG = {"id": "c", "url": "https://hooks.example.org/a2a"}


@pytest.fixture
def agent():
    readiness_reset()  # no readiness cached from an earlier test
    yield AgentFactory(executor="external")
    readiness_reset()


def switched_off(agent):
    agent.push_notifications_enabled = False
    agent.save(update_fields=["push_notifications_enabled"])
    return agent


def test_push_config_gate_passes_with_push_on_and_a_live_delivery_worker(agent):
    mark_workers_live()
    push_config_gate(agent=agent)


def test_push_config_gate_refuses_for_good_when_push_is_switched_off(agent):
    mark_workers_live()
    switched_off(agent)
    with pytest.raises(PushNotSupported):
        push_config_gate(agent=agent)
    with pytest.raises(PushNotSupported):  # reads and deletes too
        push_config_gate(agent=agent, registering=False)


def test_push_config_gate_refuses_with_a_retry_hint_while_no_delivery_worker_is_live(agent):
    with pytest.raises(PushDeliveryUnavailable) as refused:
        push_config_gate(agent=agent)
    assert refused.value.retry_after == readiness.RETRY_AFTER_SECONDS


def test_push_config_gate_counts_only_a_worker_consuming_webhooks(agent):
    mark_workers_live(queues=("agents", "heartbeat"))
    with pytest.raises(PushDeliveryUnavailable):
        push_config_gate(agent=agent)


def test_push_config_gate_lets_reads_and_deletes_through_without_a_worker(agent):
    push_config_gate(agent=agent, registering=False)


def test_push_config_gate_uses_the_readiness_it_is_given(agent):
    mark_workers_live()
    down = readiness.Readiness(checks=[], delivery_live=False, ever_ready=True)
    with pytest.raises(PushDeliveryUnavailable):
        push_config_gate(agent=agent, readiness_now=down)
    readiness_reset()
    up = readiness.Readiness(checks=[], delivery_live=True, ever_ready=True)
    push_config_gate(agent=agent, readiness_now=up)  # no worker row: the given one decides


def test_push_config_create_refuses_an_agent_whose_push_is_off_and_writes_nothing(agent):
    task = task_create(agent=agent, owner="o", message=user_message("hi"))
    switched_off(agent)
    with pytest.raises(PushNotSupported):
        push_config_create(task=task, config=CONFIG)
    assert not PushConfig.objects.exists()
    assert not Delivery.objects.exists()
