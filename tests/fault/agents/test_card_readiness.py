"""The founding incident (shared/incidents/card-published-before-dispatcher.md) with real
processes: a live uvicorn web process, Celery worker and beat processes, a webhook receiver
process.

An instance that has never been ready answers its card with 503 and refuses push registrations
with a retryable error; it becomes ready only once a worker has proven itself end to end (beat
→ `heartbeat` queue → worker → database) and re-enqueued its backlog. A worker stopped as a
rolling deploy stops it (SIGTERM, warm shutdown) flips `pushNotifications` to false within the
heartbeat freshness window, and what was accepted before waits in the outbox until a worker
returns: nothing lost, in order, verified as a client verifies it. A web process told to stop
turns not-ready at once and still finishes what it is serving.

Short timings: a heartbeat every second, fresh for 3 s, readiness cached 0.2 s, sweeps every
second, webhook retries every second.
"""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
import redis
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from agents.models import WorkerHeartbeat
from agents.readiness import RETRY_AFTER_SECONDS
from tasks.models import Task, TaskEvent
from tasks.states import TaskState
from tests import live
from tests.factories import AgentFactory, user_message
from tests.processes import wait_until
from tests.webhook_checks import (
    ALLOWED,
    accepted,
    assert_delivered,
    configure,
    deliveries,
    start_worker,
    wait_all,
)
from webhooks.models import Delivery, DeliveryState, PushBinding, PushConfig

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FRESH_SECONDS = 3
HEARTBEAT_SECONDS = 1
READINESS_CACHE_SECONDS = 0.2
# How long after its last heartbeat a stopped worker may still count as live on a card: the
# freshness window, plus the heartbeat it may have written just before it stopped, the
# readiness cache and slack for a loaded machine.
FLIP_WITHIN = FRESH_SECONDS + HEARTBEAT_SECONDS + READINESS_CACHE_SECONDS + 2
ENV = {
    "A2A_HEARTBEAT_INTERVAL_SECONDS": str(HEARTBEAT_SECONDS),
    "A2A_HEARTBEAT_FRESH_SECONDS": str(FRESH_SECONDS),
    "A2A_READINESS_CACHE_SECONDS": str(READINESS_CACHE_SECONDS),
    "A2A_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_DISPATCH_UNCLAIMED_SECONDS": "2",
    "A2A_DISPATCH_LEASE_SECONDS": "3",
    "A2A_WEBHOOK_ALLOWED_NETWORKS": ALLOWED,
    # Retries every second, never dead-lettered within a test.
    "A2A_WEBHOOK_RETRY_SCHEDULE": ",".join(["1"] * 30),
    "A2A_SHUTDOWN_GRACE_SECONDS": "0",
}
RETRY_REASON = "PUSH_DELIVERY_UNAVAILABLE"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
TOKEN = "incident-token"


@pytest.fixture(autouse=True)
def _setup(settings):
    configure(settings)  # this process checks the receivers' URLs too
    settings.A2A_HEARTBEAT_FRESH_SECONDS = FRESH_SECONDS
    # No broker message of an earlier test (its beat's heartbeats, its tasks) reaches ours.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    with override_settings(
        A2A_HEARTBEAT_INTERVAL_SECONDS=HEARTBEAT_SECONDS,
        A2A_SWEEP_INTERVAL_SECONDS=1,
        A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS=1,
    ):
        call_command("sync_schedules", stdout=io.StringIO())
    heartbeat = PeriodicTask.objects.get(name="worker heartbeat")
    assert (heartbeat.task, heartbeat.queue, heartbeat.interval.every) == (
        "heartbeat.beat",
        "heartbeat",
        HEARTBEAT_SECONDS,
    )


@pytest.fixture
def agent(transactional_db):
    return AgentFactory(slug="incident", executor="scripted")


class Client:
    """A client of one web process, over real HTTP."""

    def __init__(self, web: live.LiveWeb, agent) -> None:
        self.web = web
        self.base = f"{web.url}/{agent.slug}"
        self.http = httpx.Client(timeout=20)

    def card(self, **headers: str) -> httpx.Response:
        return self.http.get(f"{self.base}/.well-known/agent-card.json", headers=headers)

    def readyz(self) -> httpx.Response:
        return self.http.get(f"{self.web.url}/readyz")

    def healthz(self) -> httpx.Response:
        return self.http.get(f"{self.web.url}/healthz")

    def rest(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        return self.http.request(
            method, f"{self.base}{path}", json=body, headers={"A2A-Version": "1.0"}
        )

    def rpc(self, method: str, params: dict) -> httpx.Response:
        return self.http.post(
            f"{self.base}/", json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
        )

    # Operations over either binding.

    def send(self, text: str, *, binding: str = "rest", push: dict | None = None, **msg):
        params: dict[str, Any] = {
            "message": user_message(text, **msg),
            "configuration": {"returnImmediately": True},
        }
        if push is not None:
            params["configuration"]["taskPushNotificationConfig"] = push
        if binding == "rest":
            return self.rest("POST", "/message:send", params)
        return self.rpc("SendMessage", params)

    def create_config(self, task_id: str, config: dict, *, binding: str = "rest"):
        if binding == "rest":
            return self.rest("POST", f"/tasks/{task_id}/pushNotificationConfigs", config)
        return self.rpc("CreateTaskPushNotificationConfig", {"taskId": task_id, **config})

    def wait_card(self, predicate, timeout: float = 20, message: str = "card") -> httpx.Response:
        return wait_until(
            lambda: (r := self.card()) and predicate(r) and r,
            timeout=timeout,
            interval=0.1,
            message=message,
        )


def sent_task(response: httpx.Response) -> Task:
    assert response.status_code == 200, response.text
    body = response.json()
    task = body["task"] if "task" in body else body["result"]["task"]
    return Task.objects.get(pk=task["id"])


def row_counts() -> tuple[int, int, int, int]:
    return (
        Task.objects.count(),
        PushConfig.objects.count(),
        PushBinding.objects.count(),
        Delivery.objects.count(),
    )


def assert_retryable_refusal(response: httpx.Response, binding: str) -> None:
    """Push registration refused with a retryable error: REST 503 + Retry-After, JSON-RPC
    HTTP 200 + -32603 + ErrorInfo PUSH_DELIVERY_UNAVAILABLE + RetryInfo + Retry-After."""
    assert int(response.headers["retry-after"]) == RETRY_AFTER_SECONDS, response.headers
    if binding == "rest":
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert (error["code"], error["status"]) == (503, "UNAVAILABLE")
        details = error["details"]
    else:
        assert response.status_code == 200, response.text
        error = response.json()["error"]
        assert error["code"] == -32603
        details = error["data"]
    info = next(d for d in details if d["@type"] == ERROR_INFO)
    assert info["reason"] == RETRY_REASON
    retry = next(d for d in details if d["@type"] == RETRY_INFO)
    assert retry["retryDelay"] == f"{response.headers['retry-after']}s"


def assert_push_refused(client: Client, task: Task, hook: str) -> None:
    """Both ways to register, on both bindings: refused, and nothing written."""
    before = row_counts()
    for binding in ("rest", "jsonrpc"):
        config = {"id": f"refused-{binding}", "url": hook}
        assert_retryable_refusal(
            client.create_config(str(task.pk), config, binding=binding), binding
        )
        inline = client.send("hello", binding=binding, push={"url": hook})
        assert_retryable_refusal(inline, binding)
    # The incident's own call: a v0.3 client's tasks/pushNotificationConfig/set.
    legacy = client.http.post(
        f"{client.base}/v0.3",
        json={
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tasks/pushNotificationConfig/set",
            "params": {"taskId": str(task.pk), "pushNotificationConfig": {"url": hook}},
        },
    )
    assert legacy.status_code == 200, legacy.text
    assert int(legacy.headers["retry-after"]) == RETRY_AFTER_SECONDS
    error = legacy.json()["error"]
    assert (error["code"], error["data"]["reason"]) == (-32603, RETRY_REASON)
    assert row_counts() == before, "a refused registration wrote something"


def push_live(response: httpx.Response) -> bool:
    return response.status_code == 200 and response.json()["capabilities"]["pushNotifications"]


def push_off(response: httpx.Response) -> bool:
    return response.status_code == 200 and not response.json()["capabilities"]["pushNotifications"]


def live_delivery_workers() -> list[WorkerHeartbeat]:
    fresh_after = timezone.now() - timedelta(seconds=FRESH_SECONDS)
    return [
        row
        for row in WorkerHeartbeat.objects.filter(beat_at__gte=fresh_after)
        if "webhooks" in row.queues and row.backlog_reenqueued_at is not None
    ]


def wait_state(task: Task, state: TaskState, timeout: float = 20) -> Task:
    return wait_until(
        lambda: Task.objects.filter(pk=task.pk, state=state).first(),
        timeout=timeout,
        message=f"task {task.pk} {state.name}",
    )


# --- (a) to (d): never ready, ready, a worker stopped mid-task, a worker back ---------------


def never_ready(client: Client, receiver) -> Task:
    """(a) Web started before any worker: the card is an honest 503, push is refused."""
    card = client.card()
    assert card.status_code == 503, card.text
    assert int(card.headers["retry-after"]) == RETRY_AFTER_SECONDS
    assert card.headers["cache-control"] == "no-store"
    assert "etag" not in card.headers
    body = card.json()
    assert body["status"] == "not ready"
    # This process's database, migrations and event hub are fine: the workers are missing.
    assert set(body["failing"]) == {"agents_worker", "delivery_worker"}
    assert "agents" in body["failing"]["agents_worker"]
    assert "webhooks" in body["failing"]["delivery_worker"]

    ready = client.readyz()
    assert ready.status_code == 503
    assert int(ready.headers["retry-after"]) == RETRY_AFTER_SECONDS
    checks = ready.json()["checks"]
    assert {name for name, c in checks.items() if not c["ok"]} == {
        "agents_worker",
        "delivery_worker",
    }
    assert checks["event_hub"]["ok"]
    assert checks["migrations"]["ok"]
    assert checks["broker"]["ok"]
    assert client.healthz().status_code == 200  # liveness is not readiness

    # A task can be opened (it waits durably for a worker); a webhook for it cannot be.
    task = sent_task(client.send("ask"))
    assert task.task_state == TaskState.SUBMITTED
    assert_push_refused(client, task, receiver.url)
    assert not PushConfig.objects.exists()
    assert not Delivery.objects.exists()
    return task


def becomes_ready(client: Client) -> httpx.Response:
    card = client.wait_card(push_live, message="card 200 with pushNotifications")
    assert card.headers["etag"]
    assert card.json()["capabilities"]["pushNotifications"] is True
    ready = client.readyz()
    assert ready.status_code == 200, ready.text
    assert all(c["ok"] for c in ready.json()["checks"].values())
    assert live_delivery_workers(), "ready only with a worker proven by its heartbeat"
    return card


def webhook_registered_and_delivered(client: Client, agent, task: Task, receiver) -> PushConfig:
    """(b) Register a webhook on the waiting task, move the task: every event arrives."""
    task = wait_state(task, TaskState.INPUT_REQUIRED)
    created = client.create_config(str(task.pk), {"id": "late", "url": receiver.url})
    assert created.status_code == 200, created.text
    assert created.json() == {"id": "late", "taskId": str(task.pk), "url": receiver.url}
    config = PushConfig.objects.get(task=task, config_id="late")
    follow_up = client.send("go on", binding="jsonrpc", taskId=str(task.pk))
    assert follow_up.status_code == 200, follow_up.text
    wait_all(config, timeout=20)
    records = assert_delivered(receiver, config, agent)
    states = [r.payload.get("statusUpdate", {}).get("status", {}).get("state") for r in records]
    assert records[0].payload["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert states[-1] == "TASK_STATE_COMPLETED"
    return config


def worker_stopped_mid_task(
    client: Client, agent, worker, receiver, ready_card: httpx.Response, earlier: PushConfig
) -> tuple[Task, PushConfig]:
    """(c) A task with a webhook is WORKING, its deliveries still owed (the receiver is
    failing), when the worker is stopped as a rolling deploy stops it."""
    receiver.behave(status=503)
    sent = client.send(
        "work 3", binding="jsonrpc", push={"id": "inline", "url": receiver.url, "token": TOKEN}
    )
    task = sent_task(sent)
    config = PushConfig.objects.get(task=task, config_id="inline")
    wait_state(task, TaskState.WORKING)
    receiver.wait_for(lambda rs: len(rs) >= 2, message="the failing receiver tried")
    stopped_at = time.monotonic()
    worker.stop(timeout=20)  # SIGTERM: warm shutdown
    assert worker.popen.returncode == 0, worker.log()[-2000:]
    assert "worker: Warm shutdown" in worker.log()
    receiver.behave(status=200)
    owed = deliveries(config)
    assert owed, "accepted before the stop"
    assert owed[0].state != DeliveryState.DELIVERED, "and not yet delivered"
    assert not any(accepted(r) for r in receiver.records())

    # Within the freshness window the card stops advertising push; it is still served (this
    # instance was ready), as a new card under a new ETag.
    flipped = client.wait_card(push_off, timeout=FLIP_WITHIN + 5, message="pushNotifications off")
    assert time.monotonic() - stopped_at <= FLIP_WITHIN
    assert flipped.headers["etag"] != ready_card.headers["etag"]
    assert client.card(**{"If-None-Match": ready_card.headers["etag"]}).status_code == 200
    card = flipped.json()
    assert card["capabilities"]["pushNotifications"] is False
    assert card["name"] == ready_card.json()["name"]
    readyz = client.readyz()
    assert readyz.status_code == 503
    assert not readyz.json()["checks"]["delivery_worker"]["ok"]

    # New registrations are refused with the retryable error; nothing is written.
    assert_push_refused(client, task, receiver.url)
    # Reading and deleting a config promise no delivery: a client can still unsubscribe.
    path = f"/tasks/{earlier.task_id}/pushNotificationConfigs"
    got = client.rest("GET", f"{path}/{earlier.config_id}")
    assert got.status_code == 200, got.text
    assert got.json()["id"] == earlier.config_id
    assert [c["id"] for c in client.rest("GET", path).json()["configs"]] == [earlier.config_id]
    assert client.rest("DELETE", f"{path}/{earlier.config_id}").status_code == 200
    assert client.rest("GET", path).json()["configs"] == []
    # What was accepted before waits: no agents worker, so the task waits too, past the
    # moment its `work 3` would have completed it.
    working_at = TaskEvent.objects.get(task=task, seq=2).created_at
    due = working_at + timedelta(seconds=3 + 1)
    time.sleep(max((due - timezone.now()).total_seconds(), 0))
    assert Task.objects.get(pk=task.pk).task_state == TaskState.WORKING
    assert not Delivery.objects.filter(config=config, state=DeliveryState.DELIVERED).exists()
    return task, config


def worker_returns(
    client: Client, procs, agent, task: Task, config: PushConfig, receiver, ready_card
) -> None:
    """(c, end) A new worker: push is advertised again (the very card served before), the
    task completes, and every event the config owes is delivered, in order, verified."""
    start_worker(procs, name="second", **ENV)
    card = client.wait_card(push_live, message="pushNotifications back")
    assert card.headers["etag"] == ready_card.headers["etag"]
    assert card.content == ready_card.content
    wait_all(config, timeout=30)
    task.refresh_from_db()
    assert task.task_state == TaskState.COMPLETED
    records = assert_delivered(receiver, config, agent, token=TOKEN, exactly_once=False)
    kinds = [r.header("x-a2a-event-kind") for r in records if accepted(r)]
    assert kinds == ["snapshot", "status", "artifact", "status"]
    assert records[0].payload["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert [r.seq for r in records if accepted(r)] == [d.seq for d in deliveries(config)]


@pytest.fixture
def webs(tmp_path):
    """Start live web processes with `webs(**env)` (ENV plus overrides); all stopped at the
    end, their logs shown when a test fails."""
    started: list[live.LiveWeb] = []

    def start(**env: str) -> live.LiveWeb:
        name = f"web-{len(started) + 1}"
        web = live.start_web(tmp_path, name=name, **{**ENV, **env})
        started.append(web)
        return web

    yield start
    for web in started:
        web.stop()
        print(f"----- {web.proc.name} log (tail) -----\n{web.log()[-6000:]}")  # noqa: T201


@pytest.mark.parametrize("order", ["web first", "worker first"])
def test_the_card_is_a_readiness_artifact(agent, procs, receivers, webs, order):
    first = receivers.start("first")
    second = receivers.start("second")
    if order == "web first":
        client = Client(webs(), agent)
        waiting = never_ready(client, first)
        procs.beat(**ENV)
        worker = start_worker(procs, name="first", **ENV)
        ready_card = becomes_ready(client)
    else:
        # (d) The same with the other start order, on another web process: a worker (and
        # beat) first; the web process is ready from its first request.
        procs.beat(**ENV)
        worker = start_worker(procs, name="first", **ENV)
        wait_until(live_delivery_workers, timeout=20, message="a live delivery worker")
        client = Client(webs(), agent)
        ready_card = client.card()
        assert push_live(ready_card), ready_card.text
        becomes_ready(client)
        waiting = sent_task(client.send("ask"))
    earlier = webhook_registered_and_delivered(client, agent, waiting, first)
    task, config = worker_stopped_mid_task(client, agent, worker, second, ready_card, earlier)
    worker_returns(client, procs, agent, task, config, second, ready_card)


# --- (e) a web process told to stop ----------------------------------------------------------


def test_sigterm_turns_the_web_process_not_ready_at_once_and_drains(agent, procs, webs):
    grace = 4.0
    procs.beat(**ENV)
    start_worker(procs, name="worker", **ENV)
    web = webs(A2A_SHUTDOWN_GRACE_SECONDS=str(grace))
    client = Client(web, agent)
    client.wait_card(push_live, message="ready")

    # A blocking SendMessage in flight: the task works for 2 s before it completes.
    answer: dict[str, Any] = {}

    def blocking_send() -> None:
        with httpx.Client(timeout=30) as http:
            response = http.post(
                f"{client.base}/message:send",
                headers={"A2A-Version": "1.0"},
                json={"message": user_message("work 2")},
            )
            answer["status"], answer["body"], answer["at"] = (
                response.status_code,
                response.json(),
                time.monotonic(),
            )

    thread = threading.Thread(target=blocking_send)
    thread.start()
    task = wait_until(lambda: Task.objects.first(), message="the task opened")
    wait_state(task, TaskState.WORKING)

    os.kill(web.proc.pid, signal.SIGTERM)
    signalled = time.monotonic()
    # The very next requests: not ready (a load balancer stops routing here), but served.
    readyz = client.readyz()
    card = client.card()
    assert time.monotonic() - signalled < grace
    assert readyz.status_code == 503
    assert readyz.json()["draining"] is True
    assert int(readyz.headers["retry-after"]) == RETRY_AFTER_SECONDS
    assert card.status_code == 503
    assert int(card.headers["retry-after"]) == RETRY_AFTER_SECONDS
    assert "shutdown" in card.json()["failing"]
    assert client.healthz().status_code == 200  # alive while it drains
    assert client.rest("GET", f"/tasks/{task.pk}").status_code == 200
    assert web.proc.popen.poll() is None

    # The request in flight when the signal came is answered, in full.
    thread.join(timeout=grace + 20)
    assert answer["status"] == 200, answer
    assert answer["body"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    web.proc.popen.wait(timeout=grace + 20)
    stopped = time.monotonic()
    assert stopped - signalled >= grace, "stopped accepting before the grace period"
    # uvicorn re-raises the signal it was stopped by once it has shut down cleanly.
    assert web.proc.popen.returncode in (0, -signal.SIGTERM), web.log()[-3000:]
    assert "Application shutdown complete." in web.log()
    with pytest.raises(httpx.TransportError):
        client.healthz()


# --- recovery paths of the gate -------------------------------------------------------------


def test_a_worker_whose_backlog_re_enqueue_failed_registers_again_on_its_next_heartbeat(
    agent, procs, webs
):
    """A publish error at start-up leaves the worker's row without a backlog re-enqueue: it
    must not stay a non-delivery worker until restarted; its next heartbeat re-enqueues the
    backlog and the card advertises push again."""
    procs.beat(**ENV)
    worker = start_worker(procs, name="worker", **ENV)
    client = Client(webs(), agent)
    client.wait_card(push_live, message="ready")
    # What register_worker records when a send_job of the re-enqueue returned False.
    row = WorkerHeartbeat.objects.get()
    log_before = len(worker.log())
    WorkerHeartbeat.objects.filter(pk=row.pk).update(backlog_reenqueued_at=None)
    assert not live_delivery_workers()
    # Beats come every second: the next one re-registers, re-enqueueing the backlog.
    wait_until(live_delivery_workers, timeout=FLIP_WITHIN, message="re-registered")
    row.refresh_from_db()
    assert row.backlog_reenqueued_at is not None
    assert row.backlog_reenqueued_at >= row.started_at
    assert "'registered'" in worker.log()[log_before:]  # heartbeat.beat's answer
    client.wait_card(push_live, timeout=FLIP_WITHIN, message="push advertised again")
