"""The management API's webhook reads stay bounded: a task's channel history and a page of
endpoints' health take a fixed number of queries however long the history or the page; and
retry-now refuses a deleted config's delivery, naming why."""

from __future__ import annotations

import pytest

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message
from tests.protocol_push import task_with_push
from webhooks.console.delivery_actions import delivery_retry_now
from webhooks.models import Delivery, Endpoint
from webhooks.rebinds.operations import RebindRequest, rebind_cutover, rebind_orphans, rebind_start
from webhooks.selectors import endpoint_health, task_channel_history
from webhooks.services import push_config_create, push_config_delete

# Transactional: a task a rebind acts on is opened through the protocol app, whose ORM calls
# run on other threads (tests/protocol_push.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("public_dns")]


def _moved_task(agent, rounds: int):
    """A task (opened through the protocol with its config inline) whose config went through
    `rounds` cutover rebinds (each re-bound)."""
    task = task_with_push(agent, "https://h.example.org/r0/t", config_id="c")
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    for n in range(rounds):
        old, new = f"https://h.example.org/r{n}/", f"https://h.example.org/r{n + 1}/"
        rebind = rebind_start(RebindRequest(agent=agent, move_from=old, move_to=new), actor="t")
        rebind_cutover(rebind.pk, actor="t")
        rebind_orphans(rebind.pk, actor="t")
    return task


@pytest.mark.parametrize("rounds", [1, 4])
def test_channel_history_takes_four_queries_whatever_its_length(django_assert_num_queries, rounds):
    task = _moved_task(AgentFactory(executor="external"), rounds)
    with django_assert_num_queries(4):
        history = task_channel_history(task)
    assert [v["version"] for v in history["versions"]] == list(range(1, rounds + 2))
    assert [m["state"] for m in history["moves"]] == ["rebound"] * rounds
    assert len(history["notices"]) >= rounds


def test_endpoint_health_takes_three_queries_for_a_page(django_assert_max_num_queries):
    agent = AgentFactory(executor="external")
    for i in range(6):
        task = task_create(agent=agent, owner="anonymous", message=user_message("x"))
        push_config_create(task=task, config={"id": "c", "url": f"https://e{i}.example.org/t"})
    page = list(Endpoint.objects.all())
    with django_assert_max_num_queries(3):
        health = endpoint_health(page)
    assert sorted(health) == sorted(e.pk for e in page)
    assert all(h["pending"] == 1 for h in health.values())  # each config's snapshot


def test_retry_now_refuses_a_deleted_configs_delivery():
    agent = AgentFactory(executor="external")
    task = task_create(agent=agent, owner="anonymous", message=user_message("x"))
    push_config_create(task=task, config={"id": "c", "url": "https://e.example.org/t"})
    push_config_delete(task=task, config_id="c")
    snapshot = Delivery.objects.get(task=task)
    outcome = delivery_retry_now(event_ids=[snapshot.event_id], actor="op")
    assert outcome.done == []
    assert [(s.id, s.reason) for s in outcome.skipped] == [(snapshot.event_id, "config_deleted")]
    assert OperatorAction.objects.get().target == {"deliveries": []}
