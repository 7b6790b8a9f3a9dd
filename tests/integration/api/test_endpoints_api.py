"""`/api/v1/endpoints/` over HTTP against a live web process, with a real Celery worker
delivering to receiver processes (one answering 200, one 500): each endpoint's health is what
the deliveries did; pause and resume go through the admin's services, audited as the API's
caller; a read token cannot pause (403, nothing changed); hostile input is a 400."""

from __future__ import annotations

import datetime as dt

import pytest

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.factories import AgentFactory
from tests.processes import wait_until
from tests.webhook_checks import open_task, start_worker
from webhooks.models import Delivery, DeliveryAttempt, DeliveryState, Endpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_receivers")]


@pytest.fixture
def delivered(api_web, procs, receivers):
    """An endpoint that accepted its deliveries and one that failed every try."""
    agent = AgentFactory(slug="hooks", executor="external")
    good, bad = receivers.start("good"), receivers.start("bad", status=500)
    start_worker(procs)
    task, (good_config,) = open_task(agent, "to good", {"id": "g", "url": good.url})
    failing, (bad_config,) = open_task(agent, "to bad", {"id": "b", "url": bad.url})
    for t in (task, failing):
        services.task_transition(task_id=t.pk, to_state=TaskState.WORKING)
    wait_until(
        lambda: (
            not Delivery.objects.filter(config=good_config)
            .exclude(state=DeliveryState.DELIVERED)
            .exists()
        ),
        message="the good receiver's deliveries delivered",
    )
    wait_until(
        lambda: (
            DeliveryAttempt.objects.filter(
                delivery__config=bad_config, duration_ms__isnull=False
            ).count()
            >= 2
        ),
        message="two finished attempts at the bad receiver",
    )
    return {
        "task": task,
        "good": Endpoint.objects.get(origin=good.origin),
        "bad": Endpoint.objects.get(origin=bad.origin),
    }


@pytest.fixture
def receiver_endpoint(api_web, public_dns) -> Endpoint:
    """An endpoint made as every endpoint is: by registering a webhook to it."""
    agent = AgentFactory(slug="hooks", executor="external")
    open_task(agent, "hi", {"id": "c", "url": "https://receiver.example.org/hook"})
    return Endpoint.objects.get()


def _audited() -> list[tuple[str, str, dict]]:
    rows = OperatorAction.objects.exclude(action="api_token_create").order_by("created_at", "id")
    return list(rows.values_list("actor", "action", "target"))


def test_endpoints_list_with_the_health_their_deliveries_gave_them(delivered, tokens):
    api = tokens.client("read")
    answer = api.get("/api/v1/endpoints/")
    assert answer.status_code == 200, answer.text
    rows = {e["origin"]: e for e in answer.json()["results"]}
    good, bad = rows[delivered["good"].origin], rows[delivered["bad"].origin]
    assert good["id"] == delivered["good"].pk
    assert good["health"]["failing"] is False
    assert good["health"]["lastHour"]["attempts"] == 2  # the snapshot and the status update
    assert good["health"]["lastHour"]["successRate"] == 1.0
    assert good["health"]["lastHour"]["meanLatencyMs"] > 0
    assert good["health"]["failingSince"] is None
    assert bad["health"]["failing"] is True
    # Not exact: the worker goes on retrying the bad receiver while this reads.
    assert bad["health"]["consecutiveFailures"] >= 2
    assert bad["health"]["lastHour"]["successRate"] == 0.0
    first_failure = (
        DeliveryAttempt.objects.filter(delivery__binding__endpoint=delivered["bad"])
        .order_by("started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    since = dt.datetime.fromisoformat(bad["health"]["failingSince"].replace("Z", "+00:00"))
    assert since == first_failure
    failing = api.get("/api/v1/endpoints/", params={"failing": "true"}).json()["results"]
    assert [e["origin"] for e in failing] == [delivered["bad"].origin]
    assert api.get("/api/v1/endpoints/", params={"paused": "true"}).json()["results"] == []
    one = api.get(f"/api/v1/endpoints/{delivered['bad'].pk}")
    assert one.status_code == 200, one.text
    assert one.json()["origin"] == delivered["bad"].origin


def test_a_read_token_cannot_pause_and_nothing_changes(delivered, tokens):
    good = delivered["good"]
    for path in (f"/api/v1/endpoints/{good.pk}/pause", f"/api/v1/endpoints/{good.pk}/resume"):
        refused = tokens.client("read").post(path, json={"reason": "no"})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "permission_denied"
    good.refresh_from_db()
    assert good.paused_at is None
    assert _audited() == []


def test_pause_makes_deliveries_wait_and_resume_sends_them_audited_as_the_caller(delivered, tokens):
    good, task = delivered["good"], delivered["task"]
    api = tokens.client("operate", name="ops")
    paused = api.post(f"/api/v1/endpoints/{good.pk}/pause", json={"reason": "receiver upgrade"})
    assert paused.status_code == 200, paused.text
    assert paused.json()["health"]["paused"] is True
    assert paused.json()["health"]["pausedReason"] == "receiver upgrade"
    again = api.post(f"/api/v1/endpoints/{good.pk}/pause", json={"reason": "second"})
    assert again.json()["health"]["pausedReason"] == "receiver upgrade"  # the first pause holds

    # While it is paused, what the task owes it waits (its config is parked: never claimed).
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    held = Delivery.objects.filter(task=task).order_by("-id").first()
    assert (held.kind, held.state, held.attempts) == ("status", DeliveryState.PENDING, 0)
    read = api.get(f"/api/v1/endpoints/{good.pk}").json()
    assert read["health"]["pending"] == 1

    resumed = api.post(f"/api/v1/endpoints/{good.pk}/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["health"]["paused"] is False
    wait_until(
        lambda: Delivery.objects.filter(pk=held.pk, state=DeliveryState.DELIVERED).exists(),
        message="the held delivery sent after the resume",
    )
    user = "api:ops-user"
    assert _audited() == [
        (user, "pause_endpoint", {"endpoint": good.pk}),
        (user, "pause_endpoint", {"endpoint": good.pk}),
        (user, "resume_endpoint", {"endpoint": good.pk}),
    ]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/endpoints/abc", 400),
        ("/api/v1/endpoints/0", 400),
        ("/api/v1/endpoints/-1", 400),
        ("/api/v1/endpoints/" + "9" * 30, 400),
        ("/api/v1/endpoints/%00", 400),
        ("/api/v1/endpoints/999999", 404),
        ("/api/v1/endpoints/999999/pause", 404),
        ("/api/v1/endpoints/abc/resume", 400),
    ],
)
def test_bad_or_unknown_endpoint_ids_in_the_error_shape(api_web, tokens, path, status):
    api = tokens.client("operate")
    answer = api.post(path) if path.endswith(("pause", "resume")) else api.get(path)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == ("not_found" if status == 404 else "invalid_request")
    assert _audited() == []


@pytest.mark.parametrize(
    "body",
    [
        {"reason": "x\x00y"},
        {"reason": "r" * 301},
        {"reason": ""},
        {"reason": ["a list"]},
    ],
)
def test_a_bad_pause_reason_is_a_400_and_nothing_changes(receiver_endpoint, tokens, body):
    endpoint = receiver_endpoint
    answer = tokens.client("operate").post(f"/api/v1/endpoints/{endpoint.pk}/pause", json=body)
    assert answer.status_code == 400, answer.text
    assert "reason" in answer.json()["error"]["fields"]
    endpoint.refresh_from_db()
    assert endpoint.paused_at is None
    assert _audited() == []


def test_a_body_that_is_not_json_is_a_400(receiver_endpoint, tokens):
    endpoint = receiver_endpoint
    answer = tokens.client("operate").post(
        f"/api/v1/endpoints/{endpoint.pk}/pause",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"]
    endpoint.refresh_from_db()
    assert endpoint.paused_at is None
