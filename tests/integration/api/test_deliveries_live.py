"""`/api/v1/deliveries/` over real HTTP against a live web process, with a real Celery
worker delivering to receiver processes (tests/integration/api/test_deliveries.py covers
the same endpoints in process): the list, its filters, ordering and cursor pages, and a
delivery's attempt timeline, each compared with the store; "retry now" of a waiting delivery
(tried at once, its retry schedule kept); the replay of a dead letter and of a delivered
delivery, sent again under the same event id; a read token replays and retries nothing.

Three receivers give the three outcomes: `good` answers 200 (delivered), `flaky` 500 (a
retry an hour away: `A2A_WEBHOOK_RETRY_SCHEDULE`) and `gone` 410 (final: a dead letter)."""

from __future__ import annotations

import pytest

from agents.models import OperatorAction
from tests.factories import AgentFactory
from tests.processes import wait_until
from tests.webhook_checks import open_task, start_worker, waits_its_schedule
from webhooks.models import Delivery, DeliveryAttempt, DeliveryState

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_receivers")]

UNKNOWN = "00000000-0000-0000-0000-000000000002"
RETRY_SECONDS = (
    3600  # every wait of the schedule, jittered by ±20 % (webhooks/delivery/retry_policy.py)
)


@pytest.fixture
def traffic(api_web, procs, receivers):
    agent = AgentFactory(slug="live-dl", executor="external")
    good = receivers.start("good")
    flaky = receivers.start("flaky", status=500)
    gone = receivers.start("gone", status=410)
    start_worker(procs, A2A_WEBHOOK_RETRY_SCHEDULE=",".join([str(RETRY_SECONDS)] * 3))
    out = {"good": good, "flaky": flaky, "gone": gone}
    for name, receiver in out.copy().items():
        _, (config,) = open_task(agent, f"to {name}", {"id": name, "url": receiver.url})
        out[f"{name}_config"] = config
    wanted = {
        "good": {"state": DeliveryState.DELIVERED},
        "flaky": {"state": DeliveryState.PENDING, "attempts": 1},
        "gone": {"state": DeliveryState.DEAD},
    }
    for name, where in wanted.items():
        wait_until(
            lambda name=name, where=where: Delivery.objects.filter(
                config=out[f"{name}_config"], **where
            ).exists(),
            message=f"the {name} receiver's snapshot {where}",
        )
        out[name + "_delivery"] = Delivery.objects.get(config=out[f"{name}_config"])
    return out


def _eid(delivery: Delivery) -> str:
    return str(delivery.event_id)


def _audited() -> list[tuple[str, str, dict]]:
    rows = OperatorAction.objects.exclude(action="api_token_create").order_by("created_at", "id")
    return list(rows.values_list("actor", "action", "target"))


def _ids(answer) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [d["id"] for d in answer.json()["results"]]


def test_the_list_its_filters_pages_and_a_delivery_match_the_store(traffic, tokens):
    api = tokens.client("read", name="auditor")
    newest_first = [
        str(e)
        for e in Delivery.objects.filter(task__agent__slug="live-dl")
        .order_by("-id")
        .values_list("event_id", flat=True)
    ]
    listed = api.get("/api/v1/deliveries/", params={"agent": "live-dl"})
    assert _ids(listed) == newest_first
    for row in listed.json()["results"]:
        stored = Delivery.objects.select_related("binding__endpoint", "config").get(
            event_id=row["id"]
        )
        assert row == {
            **row,
            "taskId": str(stored.task_id),
            "agent": "live-dl",
            "configId": stored.config.config_id,
            "bindingVersion": 1,
            "endpoint": stored.binding.endpoint.origin,
            "seq": stored.seq,
            "kind": stored.kind,
            "state": stored.state,
            "attempts": stored.attempts,
            "lastStatus": stored.last_status,
        }

    by_state = {
        state: _ids(api.get("/api/v1/deliveries/", params={"agent": "live-dl", "state": state}))
        for state in ("delivered", "pending", "dead")
    }
    assert by_state == {
        "delivered": [_eid(traffic["good_delivery"])],
        "pending": [_eid(traffic["flaky_delivery"])],
        "dead": [_eid(traffic["gone_delivery"])],
    }
    gone = traffic["gone_delivery"]
    assert _ids(api.get("/api/v1/deliveries/", params={"endpoint": traffic["gone"].origin})) == [
        _eid(gone)
    ]
    assert _ids(api.get("/api/v1/deliveries/", params={"task": str(gone.task_id)})) == [_eid(gone)]
    assert _ids(api.get("/api/v1/deliveries/", params={"agent": "nobody"})) == []
    oldest_first = api.get("/api/v1/deliveries/", params={"ordering": "createdAt"})
    assert _ids(oldest_first) == newest_first[::-1]

    # Cursor pages of one: every delivery once, in the list's order, then no next page.
    walked, url, params = [], "/api/v1/deliveries/", {"pageSize": 1, "agent": "live-dl"}
    while url:
        page = api.get(url, params=params)
        walked += _ids(page)
        url, params = page.json()["next"], None
    assert walked == newest_first

    detail = api.get(f"/api/v1/deliveries/{_eid(gone)}")
    assert detail.status_code == 200, detail.text
    attempts = detail.json()["attemptsLog"]
    stored = list(DeliveryAttempt.objects.filter(delivery=gone).order_by("number"))
    assert [(a["number"], a["status"], a["url"]) for a in attempts] == [
        (s.number, 410, traffic["gone"].url) for s in stored
    ]
    assert len(stored) == 1
    missing = api.get(f"/api/v1/deliveries/{UNKNOWN}")
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["code"] == "not_found"
    bad = api.get("/api/v1/deliveries/", params={"ordering": "lastError"})
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["code"] == "invalid_request"


def test_retry_now_tries_a_waiting_delivery_at_once_and_keeps_its_schedule(traffic, tokens):
    waiting = traffic["flaky_delivery"]
    assert waits_its_schedule(waiting, RETRY_SECONDS)
    reader = tokens.client("read", name="reader")
    refused = reader.post("/api/v1/deliveries/retry", json={"ids": [_eid(waiting)]})
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "permission_denied"
    assert Delivery.objects.get(pk=waiting.pk).next_attempt_at == waiting.next_attempt_at
    assert _audited() == []

    api = tokens.client("operate", name="ops")
    answer = api.post(
        "/api/v1/deliveries/retry",
        json={"ids": [_eid(waiting), _eid(traffic["gone_delivery"]), UNKNOWN]},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["retried"], body["requested"]) == (1, 3)
    assert {s["id"]: s["reason"] for s in body["skipped"]} == {
        _eid(traffic["gone_delivery"]): "not_waiting",
        UNKNOWN: "not_found",
    }
    # Tried at once (the receiver still fails), then waiting an hour again: attempt 2 of its
    # schedule, not a fresh one.
    # (The attempt is counted when claimed, before the request: wait for its answer.)
    tried = wait_until(
        lambda: Delivery.objects.filter(
            pk=waiting.pk, attempts=2, state=DeliveryState.PENDING
        ).first(),
        message="the retried delivery's second attempt answered",
    )
    assert tried.last_status == 500
    assert waits_its_schedule(tried, RETRY_SECONDS)
    assert len(traffic["flaky"].records()) == 2
    assert _audited() == [("api:ops-user", "retry_deliveries_now", {"deliveries": [_eid(waiting)]})]


def test_replay_sends_a_dead_letter_and_a_delivered_one_again_under_their_event_ids(
    traffic, tokens
):
    dead, delivered = traffic["gone_delivery"], traffic["good_delivery"]
    reader = tokens.client("read", name="reader")
    refused = reader.post("/api/v1/deliveries/replay", json={"ids": [_eid(dead)]})
    assert refused.status_code == 403, refused.text
    assert Delivery.objects.get(pk=dead.pk).state == DeliveryState.DEAD
    assert _audited() == []

    traffic["gone"].behave(status=200)  # the receiver is back
    api = tokens.client("operate", name="ops")
    ids = [_eid(dead), _eid(delivered), _eid(traffic["flaky_delivery"])]
    answer = api.post("/api/v1/deliveries/replay", json={"ids": ids})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["replayed"], body["requested"]) == (2, 3)
    assert [(s["id"], s["reason"]) for s in body["skipped"]] == [
        (_eid(traffic["flaky_delivery"]), "not_replayable")
    ]
    for delivery in (dead, delivered):
        wait_until(
            lambda delivery=delivery: Delivery.objects.filter(
                pk=delivery.pk, state=DeliveryState.DELIVERED, attempts=1
            ).exists(),
            message=f"the replayed {delivery.config.config_id} delivered",
        )
    for name, delivery in (("gone", dead), ("good", delivered)):
        records = traffic[name].records()
        assert [r.webhook_id for r in records] == [_eid(delivery)] * 2, name
    assert [r.answer["status"] for r in traffic["gone"].records()] == [410, 200]
    assert DeliveryAttempt.objects.filter(delivery=dead).count() == 2
    (audit,) = _audited()
    assert audit[:2] == ("api:ops-user", "replay_deliveries")
    assert sorted(audit[2]["deliveries"]) == sorted([_eid(dead), _eid(delivered)])
