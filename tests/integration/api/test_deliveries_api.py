"""`/api/v1/deliveries/` beyond the list and replay (tests/integration/api/test_deliveries.py),
over HTTP against a live web process with a real Celery worker and receiver processes: the
`since` filter; "retry now" of a delivery waiting for its next try (an hour away here), which
is then sent at once, and the reason for each delivery it leaves alone; the replay's answer
saying why it replayed nothing; a read token retries nothing (403, nothing changed)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.factories import AgentFactory
from tests.processes import wait_until
from tests.webhook_checks import open_task, start_worker, waits_its_schedule
from webhooks.models import Delivery, DeliveryAttempt, DeliveryState

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_receivers")]

UNKNOWN = "00000000-0000-0000-0000-000000000001"


@pytest.fixture
def waiting(api_web, procs, receivers):
    """A delivery that failed its first try and waits an hour for the next (the worker's
    retry schedule), and a delivered one."""
    agent = AgentFactory(slug="hooks", executor="external")
    flaky, good = receivers.start("flaky", status=500), receivers.start("good")
    start_worker(procs, A2A_WEBHOOK_RETRY_SCHEDULE="3600")
    failing, (flaky_config,) = open_task(agent, "to flaky", {"id": "f", "url": flaky.url})
    task, (good_config,) = open_task(agent, "to good", {"id": "g", "url": good.url})
    wait_until(
        lambda: Delivery.objects.filter(
            config=flaky_config, state=DeliveryState.PENDING, attempts=1
        ).exists(),
        message="the flaky receiver's first try failed",
    )
    wait_until(
        lambda: Delivery.objects.filter(config=good_config, state=DeliveryState.DELIVERED).exists(),
        message="the good receiver's snapshot delivered",
    )
    return {
        "waiting": Delivery.objects.get(config=flaky_config),
        "delivered": Delivery.objects.get(config=good_config),
        "flaky": flaky,
        "failing_task": failing,
        "task": task,
    }


def _audited() -> list[tuple[str, str, dict]]:
    rows = OperatorAction.objects.exclude(action="api_token_create").order_by("created_at", "id")
    return list(rows.values_list("actor", "action", "target"))


def test_retry_now_sends_a_waiting_delivery_at_once_and_says_why_others_were_left(waiting, tokens):
    pending = waiting["waiting"]
    assert waits_its_schedule(pending, 3600)
    waiting["flaky"].behave(status=200)
    api = tokens.client("operate", name="ops")
    ids = [str(pending.event_id), str(waiting["delivered"].event_id), UNKNOWN]
    answer = api.post("/api/v1/deliveries/retry", json={"ids": ids})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["retried"], body["requested"]) == (1, 3)
    reasons = {s["id"]: s["reason"] for s in body["skipped"]}
    assert reasons == {str(waiting["delivered"].event_id): "not_waiting", UNKNOWN: "not_found"}
    assert all(s["message"] for s in body["skipped"])
    wait_until(
        lambda: Delivery.objects.filter(pk=pending.pk, state=DeliveryState.DELIVERED).exists(),
        message="the retried delivery delivered",
    )
    assert DeliveryAttempt.objects.filter(delivery=pending).count() == 2  # its schedule kept
    assert _audited() == [
        ("api:ops-user", "retry_deliveries_now", {"deliveries": [str(pending.event_id)]})
    ]


def test_retry_now_leaves_a_delivery_to_a_paused_endpoint_waiting(waiting, tokens):
    pending = waiting["waiting"]
    api = tokens.client("operate")
    paused = api.post(f"/api/v1/endpoints/{pending.binding.endpoint_id}/pause", json={})
    assert paused.status_code == 200, paused.text
    answer = api.post("/api/v1/deliveries/retry", json={"ids": [str(pending.event_id)]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["retried"] == 0
    assert [s["reason"] for s in answer.json()["skipped"]] == ["endpoint_paused"]
    before = pending.next_attempt_at
    pending.refresh_from_db()
    assert pending.next_attempt_at == before


def test_a_read_token_retries_nothing(waiting, tokens):
    pending = waiting["waiting"]
    refused = tokens.client("read").post(
        "/api/v1/deliveries/retry", json={"ids": [str(pending.event_id)]}
    )
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "permission_denied"
    before = pending.next_attempt_at
    pending.refresh_from_db()
    assert pending.next_attempt_at == before
    assert _audited() == []


def test_the_replay_says_why_nothing_was_replayed(waiting, tokens):
    api = tokens.client("operate")
    pending, delivered = waiting["waiting"], waiting["delivered"]
    answer = api.post("/api/v1/deliveries/replay", json={"ids": [str(pending.event_id), UNKNOWN]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["replayed"], body["requested"]) == (0, 2)
    reasons = {s["id"]: s["reason"] for s in body["skipped"]}
    assert reasons == {str(pending.event_id): "not_replayable", UNKNOWN: "not_found"}
    replayed = api.post("/api/v1/deliveries/replay", json={"ids": [str(delivered.event_id)]})
    assert replayed.json() == {"replayed": 1, "requested": 1, "skipped": []}


def test_deliveries_filter_by_since_and_the_other_filters(waiting, tokens):
    api = tokens.client("read")
    moment = dt.datetime.now(dt.UTC)
    assert (
        api.get("/api/v1/deliveries/", params={"since": moment.isoformat()}).json()["results"] == []
    )
    services.task_transition(task_id=waiting["task"].pk, to_state=TaskState.WORKING)
    newer = Delivery.objects.filter(task=waiting["task"], kind="status").get()
    since = api.get("/api/v1/deliveries/", params={"since": moment.isoformat()}).json()
    assert [d["id"] for d in since["results"]] == [str(newer.event_id)]
    by_task = api.get(
        "/api/v1/deliveries/",
        params={"task": str(waiting["failing_task"].pk), "state": "pending", "agent": "hooks"},
    ).json()["results"]
    assert [d["id"] for d in by_task] == [str(waiting["waiting"].event_id)]
    endpoint = waiting["waiting"].binding.endpoint.origin
    by_endpoint = api.get("/api/v1/deliveries/", params={"endpoint": endpoint}).json()
    assert [d["id"] for d in by_endpoint["results"]] == [str(waiting["waiting"].event_id)]


@pytest.mark.parametrize(
    "body",
    [
        {"ids": []},
        {"ids": ["not-a-uuid"]},
        {"ids": "00000000-0000-0000-0000-000000000001"},
        {"ids": [str(uuid.uuid4()) for _ in range(1001)]},
        {},
    ],
)
def test_a_bad_retry_body_is_a_400(api_web, tokens, body):
    answer = tokens.client("operate").post("/api/v1/deliveries/retry", json=body)
    assert answer.status_code == 400, answer.text
    assert "ids" in answer.json()["error"]["fields"]
    assert _audited() == []


@pytest.mark.parametrize(
    "since", ["yesterday", "2026-13-01T00:00:00Z", "\x00", "9999-12-31T23:59:59-14:00"]
)
def test_a_bad_since_is_a_400(api_web, tokens, since):
    answer = tokens.client("read").get("/api/v1/deliveries/", params={"since": since})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "since" in error.get("fields", {}) or error.get("field") == "since", error
