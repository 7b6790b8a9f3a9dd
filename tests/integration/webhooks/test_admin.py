"""Who may run the webhook admin's operator actions (Django's test client, PostgreSQL).

Every action that writes (pause or resume an endpoint, resolve an alert, replay deliveries,
retry one waiting for its next try) needs the change permission of the model it acts on. A
staff user who may only view is not offered the action, and posting it anyway changes
nothing: no row, no audit record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from agents.models import OperatorAction
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory, task_create, user_message
from webhooks.delivery.transport import TransportResult
from webhooks.models import Alert, AlertKind, Delivery, DeliveryState, Endpoint
from webhooks.services import endpoint_pause, push_config_create

pytestmark = pytest.mark.usefixtures("public_dns")

MODELS = ("endpoint", "alert", "delivery", "deliveryattempt", "pushconfig", "operatoraction")
VIEW = tuple(f"view_{model}" for model in MODELS)
CHANGE = ("change_endpoint", "change_alert", "change_delivery")


@dataclass(frozen=True)
class Scene:
    endpoint_pk: int  # live, not paused
    paused_endpoint_pk: int
    alert_pk: int  # the dead letter's open alert
    dead_pk: int
    delivered_pk: int
    waiting_pk: int  # answered 503: pending, its next try later


@pytest.fixture
def scene(db) -> Scene:
    """Built through the services: registrations, then real claims and records."""
    agent = AgentFactory(executor="external")

    def registered(config_id: str, url: str) -> int:
        task = task_create(agent=agent, owner="owner", message=user_message("hi"))
        return push_config_create(task=task, config={"id": config_id, "url": url}).config.pk

    def sent(config_pk: int, status: int) -> int:
        claim = delivery_claim_head(config_pk=config_pk)
        answer = TransportResult(
            status=status,
            headers={},
            body_excerpt="",
            duration_ms=4.0,
            error_class=None,
            retry_after=None,
        )
        delivery_record(claim=claim, result=answer)
        return claim.delivery_pk

    dead_pk = sent(registered("gone", "https://gone.example.org/hook"), 404)
    delivered_pk = sent(registered("fine", "https://fine.example.org/hook"), 204)
    waiting_pk = sent(registered("later", "https://later.example.org/hook"), 503)
    registered("held", "https://held.example.org/hook")
    paused = Endpoint.objects.get(origin="https://held.example.org:443")
    endpoint_pause(endpoint_pk=paused.pk, actor="setup")
    alert = Alert.objects.get(kind=AlertKind.DEAD_LETTER, resolved_at__isnull=True)
    assert Delivery.objects.get(pk=dead_pk).state == DeliveryState.DEAD
    assert Delivery.objects.get(pk=delivered_pk).state == DeliveryState.DELIVERED
    return Scene(
        endpoint_pk=Endpoint.objects.get(origin="https://fine.example.org:443").pk,
        paused_endpoint_pk=paused.pk,
        alert_pk=alert.pk,
        dead_pk=dead_pk,
        delivered_pk=delivered_pk,
        waiting_pk=waiting_pk,
    )


def staff(username: str, codenames: tuple[str, ...]):
    user = get_user_model().objects.create_user(username, password="unused", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label__in=("webhooks", "agents"), codename__in=codenames
        )
    )
    return user


@dataclass(frozen=True)
class Case:
    changelist: str
    action: str
    audit: str
    targets: Callable[[Scene], list[int]]
    done: Callable[[Scene], bool]  # the action's effect is visible in the database


def _paused(pk: int) -> bool:
    return Endpoint.objects.get(pk=pk).paused_at is not None


def _states(*delivery_pks: int) -> set[str]:
    return set(Delivery.objects.filter(pk__in=delivery_pks).values_list("state", flat=True))


CASES = {
    "pause": Case(
        "/admin/webhooks/endpoint/",
        "pause",
        "pause_endpoint",
        lambda s: [s.endpoint_pk],
        lambda s: _paused(s.endpoint_pk),
    ),
    "resume": Case(
        "/admin/webhooks/endpoint/",
        "resume",
        "resume_endpoint",
        lambda s: [s.paused_endpoint_pk],
        lambda s: not _paused(s.paused_endpoint_pk),
    ),
    "resolve": Case(
        "/admin/webhooks/alert/",
        "resolve",
        "resolve_alert",
        lambda s: [s.alert_pk],
        lambda s: Alert.objects.get(pk=s.alert_pk).resolved_at is not None,
    ),
    "replay": Case(
        "/admin/webhooks/delivery/",
        "replay",
        "replay_deliveries",
        lambda s: [s.dead_pk, s.delivered_pk],
        lambda s: _states(s.dead_pk, s.delivered_pk) == {DeliveryState.PENDING},
    ),
    "retry_now": Case(
        "/admin/webhooks/delivery/",
        "retry_now",
        "retry_deliveries_now",
        lambda s: [s.waiting_pk],
        lambda s: Delivery.objects.get(pk=s.waiting_pk).next_attempt_at <= timezone.now(),
    ),
}


def offered_actions(client, changelist: str) -> set[str]:
    response = client.get(changelist)
    assert response.status_code == 200
    form = response.context["action_form"]
    return set() if form is None else {name for name, _ in form.fields["action"].choices if name}


def run_action(client, case: Case, scene: Scene):
    response = client.post(
        case.changelist,
        {"action": case.action, "_selected_action": case.targets(scene), "index": "0"},
        follow=True,
    )
    assert response.status_code == 200
    return response


def snapshot() -> dict:
    """Every row the actions could write."""
    return {
        "endpoints": list(Endpoint.objects.order_by("pk").values()),
        "alerts": list(Alert.objects.order_by("pk").values()),
        "deliveries": list(Delivery.objects.order_by("pk").values()),
        "audit": list(OperatorAction.objects.order_by("pk").values()),
    }


def test_admin_view_only_staff_is_offered_no_action_that_writes(scene, client):
    client.force_login(staff("viewer", VIEW))
    for changelist in (
        "/admin/webhooks/endpoint/",
        "/admin/webhooks/alert/",
        "/admin/webhooks/delivery/",
        "/admin/webhooks/pushconfig/",
        "/admin/agents/operatoraction/",
    ):
        assert offered_actions(client, changelist) == set(), changelist


@pytest.mark.parametrize("name", list(CASES))
def test_admin_view_only_staff_cannot_run_the_action(scene, client, name):
    case = CASES[name]
    client.force_login(staff("viewer", VIEW))
    before = snapshot()

    run_action(client, case, scene)

    assert snapshot() == before  # no state change, no OperatorAction row
    assert not case.done(scene)


@pytest.mark.parametrize("name", list(CASES))
def test_admin_staff_with_change_permission_runs_the_action(scene, client, name):
    case = CASES[name]
    client.force_login(staff("operator", VIEW + CHANGE))
    assert case.action in offered_actions(client, case.changelist)
    audit_before = OperatorAction.objects.count()

    run_action(client, case, scene)

    assert case.done(scene)
    assert OperatorAction.objects.count() == audit_before + 1
    audit = OperatorAction.objects.latest("pk")
    assert (audit.actor, audit.action) == ("operator", case.audit)


def test_admin_change_permission_of_another_model_does_not_allow_replay(scene, client):
    """Replay needs change on Delivery; change on endpoints and alerts is not enough."""
    client.force_login(staff("endpoint-operator", (*VIEW, "change_endpoint", "change_alert")))
    assert offered_actions(client, "/admin/webhooks/delivery/") == set()
    assert offered_actions(client, "/admin/webhooks/endpoint/") == {"pause", "resume", "send_test"}
    before = snapshot()

    run_action(client, CASES["replay"], scene)

    assert snapshot() == before
