"""A draining rebind in /metrics (a2a_platform/metrics.py): its tasks still on the old channel
version, the same figure the dashboard shows, and the share of its deadline used, which moves
with the clock and is gone once the rebind completes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tasks import services
from tasks.states import TaskState
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory
from tests.protocol_push import task_with_push
from webhooks.console.dashboard import dashboard_data
from webhooks.delivery.transport import TransportResult
from webhooks.models import PushConfig, RebindState
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_advance, rebind_start

# Committed: the scrape reads in a transaction of its own (REPEATABLE READ).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("public_dns")]

V1 = "https://client.example.org/hooks/v1/"
V2 = "https://client.example.org/hooks/v2/"


def rebind_samples() -> dict[tuple[str, str], float]:
    response = Client().get("/metrics")
    assert response.status_code == 200
    return {
        (s.name, s.labels["rebind"]): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
        if "rebind" in s.labels
    }


OK = TransportResult(
    status=200, headers={}, body_excerpt="", duration_ms=2.0, error_class=None, retry_after=None
)


def deliver_all(task) -> None:
    """Every due delivery of the task's config, answered 200 (by its receiver, the far side):
    the rebind's notice on the old channel among them."""
    config = PushConfig.objects.get(task=task)
    while (claim := delivery_claim_head(config_pk=config.pk)) is not None:
        delivery_record(claim=claim, result=OK)


def test_a_draining_rebind_shows_its_tasks_on_the_old_version_and_its_deadline_used(
    time_machine,
):
    time_machine.move_to(timezone.now(), tick=False)
    agent = AgentFactory(slug="hooks", is_default=True, executor="external", signing_key=True)
    tasks = [task_with_push(agent, f"{V1}task-{i}", config_id=f"cfg-{i}") for i in range(2)]
    for task in tasks:
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    rebind = rebind_start(
        RebindRequest(agent=agent, move_from=V1, move_to=V2, deadline_seconds=1000),
        actor="ops",
    )
    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.DRAINING
    rid = str(rebind.pk)

    samples = rebind_samples()
    assert samples[("a2a_rebind_tasks_on_old_version", rid)] == 2
    (shown,) = dashboard_data()["rebinds"]
    assert shown["onOldVersion"] == 2
    assert samples[("a2a_rebind_drain_deadline_ratio", rid)] == 0

    # 90 % of the deadline used; the first task's notice reached its receiver: it moved.
    time_machine.shift(timedelta(seconds=900))
    deliver_all(tasks[0])
    samples = rebind_samples()
    assert samples[("a2a_rebind_tasks_on_old_version", rid)] == 1
    assert samples[("a2a_rebind_drain_deadline_ratio", rid)] == pytest.approx(0.9)

    assert dashboard_data()["rebinds"][0]["onOldVersion"] == 1

    deliver_all(tasks[1])
    assert rebind_advance(rebind.pk).state == RebindState.COMPLETED
    assert rebind_samples() == {}  # only open rebinds have series
