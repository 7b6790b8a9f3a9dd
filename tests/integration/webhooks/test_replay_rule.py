"""What a replay re-opens is one rule, `Delivery.objects.replayable()` (webhooks/models.py,
issue 44), whichever interface asks: the service, the explained replay behind the deliveries
admin, the rebind page and the API. Each interface gets the same selection of deliveries, one
of each case the rule decides, and must re-open exactly the ones the rule names (and the ones
that explain say why in the rule's terms): an interface with its own idea of "replayable"
fails here.
"""

from __future__ import annotations

import uuid

import pytest

from tasks import services
from tasks.states import TaskState
from tests.api_tokens import api_client
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory
from tests.protocol_push import task_with_push
from webhooks.console.delivery_actions import delivery_replay_explained
from webhooks.delivery.transport import TransportResult
from webhooks.models import REPLAYABLE_STATES, Delivery, DeliveryState, PushConfig
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_start
from webhooks.services import delivery_replay, push_config_delete

pytestmark = pytest.mark.usefixtures("public_dns")

HOOKS = "https://client.example.org/hooks/"
MOVING = "https://client.example.org/moving/v1/"
OK = TransportResult(200, {}, "", 1.0, None, None)
REFUSED = TransportResult(400, {}, "", 1.0, "http_4xx", None)


@pytest.fixture
def agent(transactional_db):
    return AgentFactory(slug="hooks", is_default=True, executor="external", signing_key=True)


def _answer(task, result: TransportResult) -> None:
    """Every due delivery of the task's config, answered `result`."""
    push = PushConfig.objects.get(task=task)
    while (claim := delivery_claim_head(config_pk=push.pk)) is not None:
        delivery_record(claim=claim, result=result)


def _task(agent, url: str, config_id: str):
    task = task_with_push(agent, url, config_id=config_id)
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    return task


@pytest.fixture
def selection(agent) -> dict[str, Delivery]:
    """One delivery per case: delivered, dead, still pending, of a deleted config, a rebind
    notice delivered (its move done: no longer awaited) and one dead whose move still waits."""
    delivered = _task(agent, f"{HOOKS}delivered", "c-delivered")
    _answer(delivered, OK)
    dead = _task(agent, f"{HOOKS}dead", "c-dead")
    _answer(dead, REFUSED)
    pending = _task(agent, f"{HOOKS}pending", "c-pending")
    deleted = _task(agent, f"{HOOKS}deleted", "c-deleted")
    _answer(deleted, OK)
    push_config_delete(task=deleted, config_id="c-deleted")
    moved = _task(agent, f"{MOVING}moved", "c-moved")
    stuck = _task(agent, f"{MOVING}stuck", "c-stuck")
    _answer(moved, OK)
    _answer(stuck, OK)
    rebind_start(
        RebindRequest(agent=agent, move_from=MOVING, move_to=MOVING.replace("v1", "v2")),
        actor="ops",
    )
    _answer(moved, OK)
    _answer(stuck, REFUSED)
    first = Delivery.objects.order_by("pk")
    picked = {
        "delivered": first.filter(task=delivered).first(),
        "dead": first.filter(task=dead).first(),
        "pending": first.filter(task=pending).first(),
        "deleted": first.filter(task=deleted).first(),
        "notice delivered": first.get(task=moved, kind="notice"),
        "notice dead": first.get(task=stuck, kind="notice"),
    }
    assert {name: d.state for name, d in picked.items()} == {
        "delivered": DeliveryState.DELIVERED,
        "dead": DeliveryState.DEAD,
        "pending": DeliveryState.PENDING,
        "deleted": DeliveryState.DELIVERED,
        "notice delivered": DeliveryState.DELIVERED,
        "notice dead": DeliveryState.DEAD,
    }
    return picked


REPLAYABLE = {"delivered", "dead", "notice dead"}
WHY_NOT = {
    "pending": "not_replayable",
    "deleted": "config_deleted",
    "notice delivered": "notice_not_awaited",
}


def _service(picked, superuser) -> None:
    delivery_replay(delivery_pks=[d.pk for d in picked.values()], actor="ops")


def _explained(picked, superuser) -> dict:
    outcome = delivery_replay_explained(
        event_ids=[d.event_id for d in picked.values()], actor="ops"
    )
    return {s.id: s.reason for s in outcome.skipped}


def _admin(picked, superuser) -> None:
    answer = superuser.post(
        "/admin/webhooks/delivery/",
        {"action": "replay", "_selected_action": [str(d.pk) for d in picked.values()]},
    )
    assert answer.status_code == 302


def _api(picked, superuser) -> dict:
    api = api_client("operator", "view_delivery", "change_delivery", scope="operate")
    answer = api.post(
        "/api/v1/deliveries/replay",
        {"ids": [str(d.event_id) for d in picked.values()]},
        format="json",
    )
    assert answer.status_code == 200, answer.content
    return {s["id"]: s["reason"] for s in answer.json()["skipped"]}


@pytest.mark.parametrize("interface", [_service, _explained, _admin, _api])
def test_every_replay_reopens_what_replayable_names(selection, superuser, interface):
    by_id = {d.event_id: name for name, d in selection.items()}
    rule = Delivery.objects.filter(pk__in=[d.pk for d in selection.values()]).replayable()
    assert {by_id[eid] for eid in rule.values_list("event_id", flat=True)} == REPLAYABLE
    skipped = interface(selection, superuser)
    reopened = {
        name
        for name, d in selection.items()
        if d.state in REPLAYABLE_STATES
        and Delivery.objects.get(pk=d.pk).state == DeliveryState.PENDING
    }
    assert reopened == REPLAYABLE
    if skipped is not None:
        assert {by_id[uuid.UUID(str(eid))]: why for eid, why in skipped.items()} == WHY_NOT
