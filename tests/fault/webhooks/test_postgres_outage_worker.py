"""A PostgreSQL outage seen from the worker's side, with real processes on a PostgreSQL server
of the test's own (tests/fault/postgres.py): deliveries in flight and an executor job in
flight when the database drops every connection.

- A delivery whose POST is in flight when the database goes away is recorded once the
  database is back (the record retried on a fresh connection), not re-sent after its lease:
  one attempt, received once.
- An executor run the outage interrupts is run again within seconds (its dispatch released
  by the runner, not re-enqueued by the sweeper after its lease) and resumes: no artifact
  chunk is sent twice, every event is delivered in order.
- While the database is down, clients get retryable refusals on both bindings (never
  "internal error") and `/readyz` names the database as the failing check.

Dispatch timings are the production ones (a 60 s lease, 30 s unclaimed): the sweeper cannot
hide a stalled run within this test.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import httpx
import pytest

from tasks.models import DispatchState, EventKind, ExecutorDispatch, Task, TaskEvent
from tasks.states import TaskState
from tests import live
from tests.factories import AgentFactory, user_message
from tests.fault.postgres import riding_out
from tests.processes import wait_until
from tests.sse import http_events
from tests.webhook_checks import (
    ALLOWED,
    assert_delivered,
    configure,
    deliveries,
    open_task,
    settled,
    start_beat,
    start_worker,
    verify,
    wait_all,
)
from tests.webhook_receiver import ReceiverProcess
from webhooks.models import DeliveryAttempt, DeliveryState, PushConfig

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HANG_SECONDS = 3
TIMEOUT_SECONDS = 8  # a hung receiver's 3 s answer is a success
ENV = {
    "A2A_WEBHOOK_ALLOWED_NETWORKS": ALLOWED,
    "A2A_WEBHOOK_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS),
    # The lease a lost record would wait out: timeout + margin = 38 s.
    "A2A_WEBHOOK_LEASE_MARGIN_SECONDS": "30",
    "A2A_WEBHOOK_RETRY_SCHEDULE": ",".join(["1"] * 20),
    "A2A_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_HEARTBEAT_INTERVAL_SECONDS": "1",
    "A2A_READINESS_CACHE_SECONDS": "0.2",
    # A request waits this long for a connection while the database is down.
    "A2A_DB_POOL_TIMEOUT": "2",
}
CHUNKS = 600
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


@pytest.fixture(autouse=True)
def _loopback(settings):
    configure(settings)


def chunk_texts(task: Task) -> list[str]:
    return [
        part["text"]
        for e in TaskEvent.objects.filter(task=task, kind=EventKind.ARTIFACT).order_by("seq")
        if e.payload["artifactUpdate"]["artifact"]["artifactId"] == "chunks-0"
        for part in e.payload["artifactUpdate"]["artifact"]["parts"]
    ]


def statuses(task: Task) -> list[str]:
    return [
        TaskState(e.payload["statusUpdate"]["status"]["state"]).short
        for e in TaskEvent.objects.filter(task=task, kind=EventKind.STATUS).order_by("seq")
    ]


def details(body: dict, binding: str) -> tuple[int, list[dict]]:
    error = body["error"]
    return error["code"], error["details"] if binding == "rest" else error["data"]


def probe_outage(web: live.LiveWeb, agent) -> dict:
    """While the database is down, at once: a SendMessage on each binding, and /readyz."""
    base = f"{web.url}/{agent.slug}"
    params = {"message": user_message("hello"), "configuration": {"returnImmediately": True}}
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
    calls = {
        "rest": ("POST", f"{base}/message:send", params),
        "jsonrpc": ("POST", f"{base}/", rpc),
        "readyz": ("GET", f"{web.url}/readyz", None),
    }
    out: dict = {}

    def call(name: str) -> None:
        method, url, body = calls[name]
        out[name] = httpx.request(
            method, url, json=body, headers={"A2A-Version": "1.0"}, timeout=30
        )

    threads = [threading.Thread(target=call, args=(name,)) for name in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return out


def assert_retryable(response: httpx.Response, binding: str) -> None:
    assert int(response.headers["retry-after"]) > 0, response.text
    if binding == "rest":
        assert response.status_code == 503, response.text
    else:
        assert response.status_code == 200, response.text  # JSON-RPC errors travel with 200
    code, info = details(response.json(), binding)
    assert code == (503 if binding == "rest" else -32603)
    reason = next(d for d in info if d["@type"] == ERROR_INFO)["reason"]
    assert reason == "DATABASE_UNAVAILABLE", response.text
    retry = next(d for d in info if d["@type"] == RETRY_INFO)
    assert retry["retryDelay"] == f"{response.headers['retry-after']}s"


def follow_stream(web: live.LiveWeb, agent, task_id: str, out: dict) -> None:
    """SubscribeToTask (JSON-RPC) from before the outage to the task's end, as a client
    does: a stream that ends early, or a refused open, is resumed with Last-Event-ID. Puts
    the event ids seen and the errors met (each stream's end or refusal) in `out`."""
    envelope = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task_id}}
    seen: list[int] = []
    errors: list[dict] = []
    out.update(seen=seen, errors=errors)

    async def follow() -> None:
        async with httpx.AsyncClient(timeout=60, headers={"A2A-Version": "1.0"}) as client:
            for _ in range(30):
                headers = {"Last-Event-ID": str(seen[-1])} if seen else {}
                stream = http_events(
                    client, "POST", f"{web.url}/{agent.slug}/", json=envelope, headers=headers
                )
                async for _, event in stream:
                    if event.is_comment:
                        continue
                    if "error" in event.data:  # an `event: error` frame, or a refused open
                        errors.append(event.data["error"])
                        break
                    seen.append(event.id)
                    update = event.data["result"].get("statusUpdate")
                    if update and update["status"]["state"] == "TASK_STATE_COMPLETED":
                        return
                await stream.aclose()
                await asyncio.sleep(0.5)

    asyncio.run(follow())


def test_outage_with_deliveries_and_an_executor_in_flight(private_postgres, procs, tmp_path):
    agent = AgentFactory(slug="outage", executor="scripted")
    hung = ReceiverProcess(tmp_path, name="hung")
    # The first three requests hang 3 s, then answer 200; the rest answer at once.
    hung.behave(sequence=[{"hang": HANG_SECONDS}] * 3 + [{"status": 200}])
    hung.start()
    steady = ReceiverProcess(
        tmp_path, name="aiohttp", command=[sys.executable, "-m", "tests.receivers.aiohttp_receiver"]
    ).start()
    try:
        start_beat(procs, **ENV)
        worker = start_worker(procs, **ENV)
        web = live.start_web(tmp_path, **ENV)
        try:
            run_outage(private_postgres, agent, hung, steady, worker, web)
        finally:
            web.stop()
            print(f"----- web log (tail) -----\n{web.log()[-5000:]}")  # noqa: T201
    finally:
        hung.stop()
        steady.stop()


def run_outage(server, agent, hung, steady, worker, web) -> None:
    wait_until(
        lambda: httpx.get(f"{web.url}/readyz", timeout=5).status_code == 200,
        timeout=60,
        message="web ready",
    )
    # Over HTTP, so the stream below (an anonymous client, as this one) may read it.
    params = {
        "message": user_message(f"chunks {CHUNKS}"),
        "configuration": {
            "returnImmediately": True,
            "taskPushNotificationConfig": {"url": steady.url},
        },
    }
    sent = httpx.post(
        f"{web.url}/{agent.slug}/message:send",
        json=params,
        headers={"A2A-Version": "1.0"},
        timeout=30,
    )
    assert sent.status_code == 200, sent.text
    long_task = Task.objects.get(pk=sent.json()["task"]["id"])
    long_config = PushConfig.objects.get(task=long_task)
    in_flight = [open_task(agent, "chunks 2", {"url": hung.url}) for _ in range(3)]
    hung.wait_for(lambda rs: len(rs) >= 3, timeout=20, message="three POSTs hanging")
    wait_until(
        lambda: long_task.artifacts.filter(chunks__gte=5).exists(),
        timeout=30,
        interval=0.02,
        message="the executor streaming chunks",
    )

    stream: dict = {}
    streamer = threading.Thread(target=follow_stream, args=(web, agent, str(long_task.pk), stream))
    streamer.start()
    wait_until(lambda: stream.get("seen"), timeout=20, message="the stream open")

    down_at = time.monotonic()
    server.stop()
    probes: dict = {}
    prober = threading.Thread(target=lambda: probes.update(probe_outage(web, agent)))
    prober.start()
    # Down until the hung receiver has answered (the sends finished, their records owed).
    time.sleep(max(0.0, down_at + HANG_SECONDS + 0.5 - time.monotonic()))
    prober.join(timeout=30)
    server.start()
    up_at = time.monotonic()

    for binding in ("rest", "jsonrpc"):
        assert_retryable(probes[binding], binding)
    ready = probes["readyz"]
    assert ready.status_code == 503, ready.text
    assert int(ready.headers["retry-after"]) > 0
    database = ready.json()["checks"]["database"]
    assert not database["ok"]
    assert database["detail"].startswith("unreachable"), database

    for _, (config,) in in_flight:
        wait_until(riding_out(lambda c=config: settled(c)), timeout=60, message="in-flight")
    delivered_after = time.monotonic() - up_at
    task = wait_until(
        riding_out(lambda: Task.objects.filter(pk=long_task.pk, state=TaskState.COMPLETED).first()),
        timeout=90,
        message="the interrupted task completed",
    )
    completed_after = time.monotonic() - up_at
    wait_all(long_config, timeout=60)
    print(  # noqa: T201
        f"outage {up_at - down_at:.1f} s; after it: the in-flight deliveries recorded (and "
        f"their successors delivered) in {delivered_after:.1f} s, the interrupted run "
        f"({CHUNKS} chunks) completed in {completed_after:.1f} s"
    )

    # The in-flight sends: recorded after the outage, not re-sent after their lease; every
    # delivery of these configs received once, in order, verified as a client verifies it.
    records = hung.records()
    for _, (config,) in in_flight:
        rows = deliveries(config)
        head = rows[0]
        assert list(
            DeliveryAttempt.objects.filter(delivery=head).values_list("status", flat=True)
        ) == [200]
        assert all(d.state == DeliveryState.DELIVERED for d in rows)
        ids = [str(d.event_id) for d in rows]
        mine = [r for r in records if r.webhook_id in ids]
        assert [r.webhook_id for r in mine] == ids
        verify(mine, agent, url=hung.url)
    # The stream: ended (or refused) only with the retryable refusal, resumed, nothing missed.
    streamer.join(timeout=60)
    assert not streamer.is_alive()
    # The store unreachable, or (a resubscription) this instance's event hub reconnecting its
    # LISTEN connection: both retryable, with a retry hint.
    met = []
    for error in stream["errors"]:
        assert error["code"] == -32603, error
        (reason,) = [d["reason"] for d in error["data"] if d["@type"] == ERROR_INFO]
        assert reason in ("DATABASE_UNAVAILABLE", "STREAMING_UNAVAILABLE"), error
        assert any(d["@type"] == RETRY_INFO for d in error["data"]), error
        met.append(reason)
    first = stream["seen"][0]
    expected = [
        seq
        for seq in TaskEvent.objects.filter(task=task)
        .exclude(kind=EventKind.MESSAGE)
        .order_by("seq")
        .values_list("seq", flat=True)
        if seq > first
    ]
    assert sorted(set(stream["seen"]) - {first}) == expected
    print(  # noqa: T201
        f"the stream: retryable refusals met {met}, resumed with Last-Event-ID, "
        f"{len(stream['seen'])} events, none missed"
    )
    # The run the outage interrupted: run again by the runner's release, resumed, not replayed.
    assert statuses(task) == ["submitted", "working", "completed"]
    assert chunk_texts(task) == [f"chunk {i} of {CHUNKS}" for i in range(1, CHUNKS + 1)]
    artifact = task.artifacts.get(artifact_id="chunks-0")
    assert (artifact.chunks, artifact.complete) == (CHUNKS, True)
    assert task.artifacts.filter(artifact_id="echo").count() == 1
    dispatch = ExecutorDispatch.objects.get(task=task)
    assert dispatch.state == DispatchState.DONE
    log = worker.log()
    assert "database unreachable during the run; running it again shortly" in log
    assert not any(
        "dispatch re-enqueued" in line and f"dispatch_id={dispatch.pk}" in line
        for line in log.splitlines()
    ), "the sweeper re-enqueued it: the run was not released"
    assert dispatch.claims == 2
    assert "executor crashed" not in log
    records = assert_delivered(steady, long_config, agent, exactly_once=False)
    # Each event at most twice (a send whose record was lost), never a repeated step.
    assert len({r.webhook_id for r in records}) == len(deliveries(long_config))
