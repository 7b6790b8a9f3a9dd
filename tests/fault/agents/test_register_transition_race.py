"""Push registration racing task transitions, across processes, on PostgreSQL.

Fifty pairs at once: a client opens a task on one web process and registers a webhook for it
on the OTHER web process — a fifth of them at once (racing the executor's start), the rest as
soon as the task has left SUBMITTED (racing its chunks) — while a worker process moves the
tasks (the scripted executor streams an artifact in ten chunks, one transaction each). A
registration is acknowledged only once it is committed with its snapshot (the task as of that
moment, under the task's row lock); from then on every transition must add a delivery for it.
So for every config: its deliveries are the snapshot and then exactly every status/artifact
event after the snapshot's seq, no gap; the snapshot is the task exactly as of that seq; and
the receiver process gets them all, in order, verified as a client verifies them.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from tasks.models import Task, TaskEvent
from tasks.states import TaskState
from tests import live
from tests.factories import AgentFactory, user_message
from tests.processes import wait_until
from tests.webhook_checks import (
    ALLOWED,
    assert_delivered,
    deliveries,
    owed_seqs,
    start_worker,
    wait_all,
)
from webhooks.models import Delivery, PushConfig

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PAIRS = 50
CHUNKS = 10
ENV = {
    "A2A_HEARTBEAT_INTERVAL_SECONDS": "1",
    "A2A_READINESS_CACHE_SECONDS": "0.2",
    "A2A_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_WEBHOOK_ALLOWED_NETWORKS": ALLOWED,
    "A2A_WEBHOOK_RETRY_SCHEDULE": ",".join(["1"] * 20),
    "A2A_SHUTDOWN_GRACE_SECONDS": "0",
    # Each web process holds one database connection per ORM thread: keep the test's share of
    # a shared server's connections small.
    "A2A_ORM_THREADS": "4",
}


@pytest.fixture(autouse=True)
def _loopback_receivers_and_an_empty_broker(loopback_receivers, settings):
    # No broker message of an earlier test (its beat's heartbeats, its tasks) reaches ours.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


@pytest.fixture(autouse=True)
def _quiet_http_client(caplog):
    caplog.set_level(logging.WARNING, logger="httpx")  # hundreds of requests


def as_of(task: Task, seq: int) -> tuple[str | None, dict[str, list]]:
    """The task's state and its artifacts' parts as its events up to `seq` make them."""
    state, artifacts = None, {}
    for event in TaskEvent.objects.filter(task=task, seq__lte=seq).order_by("seq"):
        if "statusUpdate" in event.payload:
            state = event.payload["statusUpdate"]["status"]["state"]
        elif "artifactUpdate" in event.payload:
            update = event.payload["artifactUpdate"]
            artifact = update["artifact"]
            before = artifacts.get(artifact["artifactId"], []) if update.get("append") else []
            artifacts[artifact["artifactId"]] = before + artifact["parts"]
    return state, artifacts


def test_fifty_concurrent_register_transition_pairs_lose_no_event(procs, receivers, tmp_path):
    agent = AgentFactory(slug="race", executor="scripted")
    receiver = receivers.start()
    with override_settings(A2A_HEARTBEAT_INTERVAL_SECONDS=1, A2A_SWEEP_INTERVAL_SECONDS=1):
        call_command("sync_schedules", stdout=io.StringIO())
    procs.beat(**ENV)
    start_worker(procs, name="mover", **ENV)
    webs = [live.start_web(tmp_path, name=f"web-{i}", **ENV) for i in (1, 2)]
    clients = [httpx.Client(base_url=f"{w.url}/{agent.slug}", timeout=30) for w in webs]
    try:
        for client in clients:
            wait_until(
                lambda c=client: c.get("/.well-known/agent-card.json").status_code == 200,
                timeout=20,
                message="both web processes ready",
            )
        start = threading.Barrier(PAIRS)
        working: dict[str, threading.Event] = {}
        done = threading.Event()

        def watch() -> None:
            """One poller (one database connection) for all pairs: wakes each pair as soon
            as its task has left SUBMITTED."""
            try:
                while not done.is_set():
                    waiting = {k: e for k, e in list(working.items()) if not e.is_set()}
                    if waiting:
                        moved = Task.objects.filter(pk__in=list(waiting)).exclude(
                            state=TaskState.SUBMITTED
                        )
                        for pk in moved.values_list("pk", flat=True):
                            waiting[str(pk)].set()
                    time.sleep(0.005)
            finally:
                connection.close()

        watcher = threading.Thread(target=watch)
        watcher.start()

        def pair(i: int) -> tuple[str, int, dict]:
            opener, registrar = clients[i % 2], clients[(i + 1) % 2]
            start.wait()
            sent = opener.post(
                "/message:send",
                headers={"A2A-Version": "1.0"},
                json={
                    "message": user_message(f"chunks {CHUNKS}"),
                    "configuration": {"returnImmediately": True},
                },
            )
            assert sent.status_code == 200, sent.text
            task_id = sent.json()["task"]["id"]
            if i % 5:
                # Most register once the executor has started (racing its chunks), the rest at
                # once (racing its start).
                working[task_id] = threading.Event()
                assert working[task_id].wait(timeout=120), f"task {task_id} never started"
            created = registrar.post(
                "/",
                json={
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "CreateTaskPushNotificationConfig",
                    "params": {"taskId": task_id, "id": f"pair-{i}", "url": receiver.url},
                },
            )
            return task_id, created.status_code, created.json()

        t0 = time.monotonic()
        try:
            with ThreadPoolExecutor(max_workers=PAIRS) as pool:
                results = list(pool.map(pair, range(PAIRS)))
        finally:
            done.set()
            watcher.join()
        print(f"registered in {time.monotonic() - t0:.1f}s")  # noqa: T201

        for task_id, status, body in results:
            assert status == 200, body
            assert body["result"]["id"].startswith("pair-"), body
            assert body["result"]["taskId"] == task_id
        configs = list(PushConfig.objects.filter(task__agent=agent).order_by("config_id"))
        assert len(configs) == PAIRS

        # Every task finishes; every config gets everything after its snapshot.
        for config in configs:
            wait_all(config, timeout=120)
        print(f"all delivered in {time.monotonic() - t0:.1f}s")  # noqa: T201
        all_records = receiver.records()
        final_seq = 0
        positions = Counter()
        for config in configs:
            task = Task.objects.get(pk=config.task_id)
            assert task.task_state == TaskState.COMPLETED
            events = list(
                TaskEvent.objects.filter(task=task, kind__in=("status", "artifact"))
                .order_by("seq")
                .values_list("seq", flat=True)
            )
            snapshot = Delivery.objects.get(config=config, kind="snapshot")
            owed = [snapshot.seq, *[s for s in events if s > snapshot.seq]]
            assert owed_seqs(config) == owed
            # The snapshot is the task exactly as of its seq: its state and its artifacts.
            snapshotted = json.loads(snapshot.body)["task"]
            state, artifacts = as_of(task, snapshot.seq)
            assert snapshotted["status"]["state"] == state
            assert {
                a["artifactId"]: a["parts"] for a in snapshotted.get("artifacts", [])
            } == artifacts
            assert [d.seq for d in deliveries(config)] == owed, f"gap for {config.config_id}"
            ids = {str(d.event_id) for d in deliveries(config)}
            assert_delivered(
                receiver,
                config,
                agent,
                records=[r for r in all_records if r.webhook_id in ids],
            )
            final_seq = task.last_seq
            positions[
                "before"
                if snapshot.seq == 1
                else "after"
                if snapshot.seq == task.last_seq
                else "during"
            ] += 1
        print(f"verified in {time.monotonic() - t0:.1f}s")  # noqa: T201
        print(f"snapshots relative to the task's transitions: {dict(positions)}")  # noqa: T201
        assert final_seq == CHUNKS + 4  # submitted, working, the chunks, echo, completed
        # The pairs really raced the transitions: many registrations landed mid-task.
        assert positions["during"] >= PAIRS // 5, positions
        assert len({r.webhook_id for r in all_records}) == Delivery.objects.count()
    finally:
        for client in clients:
            client.close()
        for web in webs:
            web.stop()
