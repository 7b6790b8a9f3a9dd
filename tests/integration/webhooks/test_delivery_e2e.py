"""Webhook delivery end to end: a real worker process delivers to a real receiver process.

The worker consumes agents, webhooks and heartbeat on the I/O-concurrent (threads) pool with
short delivery timings (tests.webhook_checks.WORKER_ENV: retries after 1,1,1,2,2 s, a 2 s
timeout, loopback allowed). The receiver (tests.webhook_receiver) is the far side we do not
own: it records what it got and answers as its control file says. Every record is verified
the way a client verifies it (webhooks.receiver.WebhookVerifier against the agent's JWKS).
"""

from __future__ import annotations

import time

import httpx
import pytest

from agents.models import OperatorAction
from agents.signing import jwks
from tasks.models import Task
from tests import live
from tests.api_tokens import bearer, token_for, user_with
from tests.factories import AgentFactory, user_message
from tests.processes import wait_until
from tests.readiness_helpers import mark_workers_live
from tests.webhook_checks import (
    ALLOWED,
    WORKER_ENV,
    accepted,
    assert_delivered,
    deliveries,
    open_task,
    settled,
    start_beat,
    start_worker,
    verify,
    wait_all,
)
from webhooks.models import (
    Alert,
    AlertKind,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    PushConfig,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]

TOKEN = "notification-token-1"
HUNG_TIMEOUT = 5

DELIVERY_PERMS = ("view_delivery", "change_delivery")


@pytest.fixture(scope="module")
def _web(django_db_setup, django_db_blocker, tmp_path_factory):
    web = live.start_web(
        tmp_path_factory.mktemp("web"),
        A2A_WEBHOOK_ALLOWED_NETWORKS=ALLOWED,
        A2A_SHUTDOWN_GRACE_SECONDS="0",
    )
    try:
        yield web
    finally:
        web.stop()


@pytest.fixture
def web(transactional_db, _web) -> live.LiveWeb:
    """A live uvicorn (module-scoped); this test's committed data is visible to it."""
    return _web


def statuses_of(config: PushConfig) -> list[list[int | None]]:
    return [
        list(DeliveryAttempt.objects.filter(delivery=d).values_list("status", flat=True))
        for d in deliveries(config)
    ]


def test_registered_through_the_protocol_every_event_arrives_once_in_order_verified(
    web, procs, receivers
):
    """SendMessage (HTTP+JSON) with an inline push config (token, Bearer without credentials):
    the snapshot, then every status/artifact event, each exactly once, in X-A2A-Task-Seq order,
    each verified: v1a signature against the agent's JWKS, our JWT (aud = the webhook URL,
    bodySha256, jti = webhook-id, iss = the card URL), the token."""
    agent = AgentFactory(executor="scripted")
    receiver = receivers.start()
    start_worker(procs)
    # The gate needs a beat-proven worker; this test is about delivery, not the gate (tested
    # with real beat heartbeats in tests/fault/agents/).
    mark_workers_live(web_url=web.url)

    sent = httpx.post(
        f"{web.url}/{agent.slug}/message:send",
        headers={"A2A-Version": "1.0"},
        json={
            "message": user_message("chunks 3"),
            "configuration": {
                "returnImmediately": True,
                "taskPushNotificationConfig": {
                    "id": "cfg-1",
                    "url": receiver.url,
                    "token": TOKEN,
                    "authentication": {"scheme": "Bearer"},
                },
            },
        },
        timeout=10,
    )
    assert sent.status_code == 200, sent.text
    task = Task.objects.get(pk=sent.json()["task"]["id"])
    config = PushConfig.objects.get(task=task, config_id="cfg-1")
    wait_all(config, timeout=20)

    binding = config.bindings.get()
    assert binding.issuer == f"{web.url}/{agent.slug}"
    # The receiver's trust anchor is the JWKS the platform publishes for the agent.
    published = httpx.get(f"{web.url}/{agent.slug}/.well-known/jwks.json", timeout=10).json()
    assert published == jwks(agent)
    records = assert_delivered(
        receiver,
        config,
        agent,
        token=TOKEN,
        bearer=True,
        issuer=binding.issuer,
        jwks_doc=published,
    )
    # submitted (snapshot), working, three chunks, the echo artifact, completed.
    assert [r.header("x-a2a-event-kind") for r in records] == [
        "snapshot", "status", "artifact", "artifact", "artifact", "artifact", "status",
    ]  # fmt: skip
    assert [r.seq for r in records] == list(range(1, 8))
    assert len({r.webhook_id for r in records}) == 7
    assert records[0].payload["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    chunks = [r.payload["artifactUpdate"]["artifact"]["parts"][0]["text"] for r in records[2:5]]
    assert chunks == ["chunk 1 of 3", "chunk 2 of 3", "chunk 3 of 3"]
    assert records[-1].payload["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert all(r.header("x-a2a-binding-version") == "cfg-1.v1" for r in records)
    # One try each; secrets are redacted in the stored attempt.
    assert statuses_of(config) == [[200]] * 7
    stored = DeliveryAttempt.objects.filter(delivery__config=config).first().request_headers
    assert stored["Authorization"] == stored["X-A2A-Notification-Token"] == "<redacted>"


def test_a_hanging_receiver_does_not_delay_another_config_of_the_task(
    scripted_agent, procs, receivers
):
    """Two configs on one task: while one receiver hangs (each try times out after 5 s), the
    other gets all its deliveries; the hung one gets them, in order, once it answers."""
    hanging = receivers.start("hanging", hang=30)
    healthy = receivers.start("healthy")
    start_worker(procs, A2A_WEBHOOK_TIMEOUT_SECONDS=str(HUNG_TIMEOUT))

    task, (slow, fast) = open_task(
        scripted_agent,
        "chunks 3",
        {"url": hanging.url, "token": TOKEN},
        {"url": healthy.url},  # no token, no authentication: neither header is sent
    )
    wait_all(fast, timeout=20)
    fast_records = assert_delivered(healthy, fast, scripted_agent)
    done_at = fast_records[-1].at
    # All of it arrived while the other receiver was still hanging on the snapshot.
    stuck = hanging.records()
    assert stuck, "the hanging receiver was tried"
    snapshot_id = str(deliveries(slow)[0].event_id)
    assert {r.webhook_id for r in stuck} == {snapshot_id}
    assert not any(accepted(r) for r in stuck)
    # The first try to the hanging receiver began before the other's last delivery and had
    # not timed out yet when that arrived.
    assert stuck[0].at < done_at < stuck[0].at + HUNG_TIMEOUT

    hanging.behave(status=200)
    wait_all(slow, timeout=30)
    slow_records = assert_delivered(hanging, slow, scripted_agent, token=TOKEN, exactly_once=False)
    assert min(r.at for r in slow_records if accepted(r)) > done_at
    head = deliveries(slow)[0]
    # Not exact: how many tries timed out depends on when the receiver stopped hanging.
    assert head.attempts >= 2
    errors = DeliveryAttempt.objects.filter(delivery=head).values_list("error_class", flat=True)
    assert list(errors)[:-1] == ["timeout"] * (head.attempts - 1)
    assert statuses_of(fast) == [[200]] * len(fast_records)


def test_a_receiver_hanging_for_many_tasks_does_not_stall_another_receiver(
    scripted_agent, procs, receivers
):
    """One endpoint (origin) hangs for ten tasks' configs, more than the worker's eight
    threads. Once it is known to fail it has one try in flight at a time, so a task whose
    webhook goes elsewhere is not queued behind its timeouts (5 s each)."""
    hanging = receivers.start("hanging", hang=30)
    healthy = receivers.start("healthy")
    start_beat(procs, **WORKER_ENV)  # configs refused by the cap are swept again
    start_worker(
        procs,
        A2A_WEBHOOK_TIMEOUT_SECONDS=str(HUNG_TIMEOUT),
        A2A_WEBHOOK_RETRY_SCHEDULE=",".join(["1"] * 30),
    )
    # Ten tasks (each owes its snapshot and the rejection) with a webhook to the hanging one.
    hung = [open_task(scripted_agent, "reject", {"url": hanging.url})[1][0] for _ in range(10)]
    endpoint = Endpoint.objects.get(origin=hanging.origin)
    in_flight = Delivery.objects.filter(binding__endpoint=endpoint, state=DeliveryState.SENDING)
    # Before any failure is known, several tries hang at once (one timeout's worth)...
    wait_until(lambda: in_flight.count() >= 2, timeout=15, message="the first tries hanging")
    # ...then, known to fail, one at a time.
    wait_until(
        lambda: (
            in_flight.count() <= 1
            and Endpoint.objects.filter(pk=endpoint.pk, consecutive_failures__gte=1).exists()
        ),
        timeout=20,
        message="the endpoint known to fail with at most one try in flight",
    )

    started = time.time()
    _, (config,) = open_task(scripted_agent, "chunks 3", {"url": healthy.url})
    peak = 0

    def healthy_done() -> bool:
        nonlocal peak
        peak = max(peak, in_flight.count())
        return settled(config)

    wait_until(healthy_done, timeout=30, interval=0.05, message="the healthy config delivered")
    records = assert_delivered(healthy, config, scripted_agent)
    assert peak <= 1, f"{peak} tries to the failing endpoint in flight at once"
    assert records[-1].at - started < HUNG_TIMEOUT, "queued behind hung tries"

    hanging.behave(status=200)
    for push in hung:
        wait_all(push, timeout=60)
        assert_delivered(hanging, push, scripted_agent, exactly_once=False)


def test_404_is_dead_lettered_with_an_alert_then_replayed_through_the_api_with_the_same_ids(
    scripted_agent, web, procs, receivers
):
    receiver = receivers.start(status=404)
    start_worker(procs)
    task, (config,) = open_task(scripted_agent, "chunks 3", {"url": receiver.url})
    wait_all(config, DeliveryState.DEAD, timeout=20)

    rows = deliveries(config)
    ids = [str(d.event_id) for d in rows]
    first_round = receiver.records()
    verify(first_round, scripted_agent, url=receiver.url)
    # A 404 is final: one try each, and a dead head does not hold back the next.
    assert [r.webhook_id for r in first_round] == ids
    assert [r.seq for r in first_round] == [d.seq for d in rows]
    assert all(d.attempts == 1 and d.last_status == 404 and d.finished_at for d in rows)
    alert = Alert.objects.get(kind=AlertKind.DEAD_LETTER, resolved_at__isnull=True)
    assert alert.endpoint.origin == receiver.origin
    assert alert.count == len(rows)
    assert "404" in alert.message

    receiver.behave(status=200)
    staff = token_for(user_with("ops", *DELIVERY_PERMS), "operate")
    clerk = token_for(user_with("clerk", *DELIVERY_PERMS, staff=False), "operate")
    idle = token_for(user_with("idle"), "operate")
    replay = f"{web.url}/api/v1/deliveries/replay"
    for token in (clerk, idle):  # not staff; staff without the delivery permissions
        refused = httpx.post(replay, json={"ids": ids}, headers=bearer(token), timeout=10)
        assert refused.status_code == 403
    assert {d.state for d in deliveries(config)} == {DeliveryState.DEAD}
    answer = httpx.post(replay, json={"ids": ids}, headers=bearer(staff), timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"replayed": len(ids), "requested": len(ids), "skipped": []}

    wait_all(config, timeout=20)
    second_round = receiver.records()[len(first_round) :]
    # The same webhook-ids (a receiver that saw one of them before dedupes it), in order.
    assert_delivered(receiver, config, scripted_agent, records=second_round)
    assert [r.webhook_id for r in second_round] == ids
    assert statuses_of(config) == [[404, 200]] * len(ids)
    action = OperatorAction.objects.get(action="replay_deliveries")
    assert action.actor == "api:ops"
    assert sorted(action.target["deliveries"]) == sorted(ids)
    listed = httpx.get(
        f"{web.url}/api/v1/deliveries/?task={task.pk}&state=delivered",
        headers=bearer(staff),
        timeout=10,
    ).json()
    assert sorted(d["id"] for d in listed["results"]) == sorted(ids)


def test_401_raises_an_auth_rejected_alert_and_is_retried_on_the_auth_schedule(
    scripted_agent, procs, receivers
):
    """A receiver refusing our credentials is the rebind incident's symptom: an alert for
    the operator, tries on the auth schedule (1 s here), then delivered once it accepts."""
    receiver = receivers.start(sequence=[{"status": 401}, {"status": 200}])
    start_worker(procs)
    task, (config,) = open_task(
        scripted_agent, "chunks 3", {"url": receiver.url, "authentication": {"scheme": "Bearer"}}
    )
    wait_all(config, timeout=20)

    alert = Alert.objects.get(kind=AlertKind.AUTH_REJECTED)
    assert alert.endpoint.origin == receiver.origin
    assert "401" in alert.message
    assert alert.resolved_at is None
    assert not Alert.objects.filter(kind=AlertKind.DEAD_LETTER).exists()
    records = assert_delivered(receiver, config, scripted_agent, bearer=True, exactly_once=False)
    head = deliveries(config)[0]
    assert [r.webhook_id for r in records[:2]] == [str(head.event_id)] * 2
    assert [r.answer.get("status") for r in records[:2]] == [401, 200]
    assert statuses_of(config)[0] == [401, 200]
