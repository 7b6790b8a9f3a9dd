"""The outermost webhooks services declare their transaction (`atomic(durable=True)`): an
operator action or a pump's claim or record refuses to run inside a caller's transaction,
which would silently move its commit (and its rings) to the caller's. `push_config_create`
is not one of them: SendMessage registers its inline config inside its own transaction."""

from __future__ import annotations

import pytest
from django.db import transaction

from tasks import services
from tests.factories import AgentFactory, user_message
from webhooks.delivery.claim_record import DeliveryClaim, delivery_claim_batch, delivery_record_many
from webhooks.delivery.transport import TransportResult
from webhooks.services import (
    alert_resolve,
    delivery_replay,
    endpoint_pause,
    endpoint_resume,
    push_config_create,
)

# A claim of nothing that exists: its record finds it stale.
NO_CLAIM = DeliveryClaim(0, 0, 0, 1, "https://hooks.example.org/a", b"", {})
OK = TransportResult(200, {}, "", 1.0, None, None)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("public_dns")]

OUTERMOST = {
    "endpoint_pause": lambda: endpoint_pause(endpoint_pk=1, actor="ops"),
    "endpoint_resume": lambda: endpoint_resume(endpoint_pk=1, actor="ops"),
    "alert_resolve": lambda: alert_resolve(alert_pk=1, actor="ops"),
    "delivery_replay": lambda: delivery_replay(delivery_pks=[1], actor="ops"),
    "delivery_claim_batch": lambda: delivery_claim_batch(limit=1),
    "delivery_record_many": lambda: delivery_record_many([(NO_CLAIM, OK)]),
}


@pytest.mark.parametrize("name", sorted(OUTERMOST))
def test_outermost_service_refuses_to_run_inside_another_transaction(name):
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        OUTERMOST[name]()


@pytest.mark.parametrize("name", sorted(OUTERMOST))
def test_outermost_service_runs_on_its_own(name):
    OUTERMOST[name]()


def test_push_config_create_runs_inside_the_callers_transaction():

    agent = AgentFactory(executor="external")
    made = []  # inside SendMessage's own transaction, as an inline config is
    task = services.task_send(
        agent=agent,
        owner="o",
        message=user_message("hi"),
        within=lambda result: made.append(
            push_config_create(task=result.task, config={"url": "https://hooks.example.org/a"})
        ),
    ).task
    (binding,) = made
    assert binding.config.task_id == task.pk
