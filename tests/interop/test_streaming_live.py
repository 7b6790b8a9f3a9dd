"""Streams across live processes: two uvicorn web instances on different ports and a real
Celery worker, on the test database and broker.

A stream opened on one instance sees every event of its task whichever instance or worker
wrote it (the founding incident's second case); many streams of one task see identical
sequences; a dropped stream resumed with Last-Event-ID on the other instance misses nothing;
the official a2a-sdk client streams on both transports and both protocol versions; and 1,000
open streams hold neither a database connection nor a thread each.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import a2a_pb2
from a2a.utils.constants import TransportProtocol
from django.conf import settings
from django.db import connection

from agents.models import Agent
from tasks.models import ACTIVE_DISPATCH_STATES, ExecutorDispatch, Task, TaskEvent
from tests import live, processes
from tests.factories import AgentFactory
from tests.interop.test_sdk_client import only_interfaces, texts, user_message
from tests.readiness_helpers import mark_workers_live
from tests.sse import SSE, http_events

pytestmark = pytest.mark.slow

JSONRPC = TransportProtocol.JSONRPC.value
HTTP_JSON = TransportProtocol.HTTP_JSON.value
S = a2a_pb2.TaskState
WEB_C = "a2a-stream-web-c"
C_ORM_THREADS = 4


@dataclass
class Instances:
    a: live.LiveWeb
    b: live.LiveWeb
    c: live.LiveWeb  # the instance the 1,000-stream test counts connections and threads of
    worker: processes.Proc

    def logs(self) -> str:
        procs = (self.a.proc, self.b.proc, self.c.proc, self.worker)
        parts = [(p.name, p.log()[-3000:]) for p in procs]
        return "\n".join(f"--- {name} ---\n{text}" for name, text in parts)


@pytest.fixture(scope="module")
def _instances(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Instances]:
    log_dir = tmp_path_factory.mktemp("streams")
    started: list[Any] = []
    try:
        worker = processes.start_worker(log_dir)
        started.append(worker)
        # No readiness drain on SIGTERM: these instances stop at the end of the module. Few ORM
        # threads, so few connections: the test server's connection limit is shared.
        fast = {"A2A_SHUTDOWN_GRACE_SECONDS": "0"}
        a = live.start_web(log_dir, name="web-a", A2A_ORM_THREADS="2", **fast)
        started.append(a)
        b = live.start_web(log_dir, name="web-b", A2A_ORM_THREADS="2", **fast)
        started.append(b)
        c = live.start_web(
            log_dir,
            name="web-c",
            A2A_ORM_THREADS=str(C_ORM_THREADS),
            **fast,
            DATABASE_URL=f"{processes.test_database_url()}?application_name={WEB_C}",
            A2A_SSE_KEEPALIVE_SECONDS="600",
        )
        started.append(c)
        yield Instances(a, b, c, worker)
    finally:
        for proc in reversed(started):
            proc.stop()


@pytest.fixture
def instances(transactional_db, _instances) -> Iterator[Instances]:
    mark_workers_live()  # readiness rows are flushed with every test's data
    yield _instances
    # The worker may still be finishing a job after the last event a test waited for; the
    # flush that follows must not race its transactions (a TRUNCATE deadlock).
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    processes.wait_until(
        lambda: (
            not ExecutorDispatch.objects.filter(state__in=ACTIVE_DISPATCH_STATES).exists()
            and not broker.llen("agents")
            and not broker.hlen("unacked")
        ),
        timeout=15,
        message="worker idle",
    )


@pytest.fixture
def agent(instances) -> Agent:
    """The default agent, once every instance serves it at the root (each caches the default
    an earlier test made for A2A_AGENT_CACHE_SECONDS: tests.live.wait_serving_default)."""
    agent = AgentFactory(executor="scripted", is_default=True)
    live.wait_serving_default([instances.a, instances.b, instances.c], agent.name)
    return agent


def run(coro) -> Any:
    return asyncio.run(coro)


def rpc(method: str, params: dict, id_: Any = 1) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


async def send(client: httpx.AsyncClient, base: str, text: str, **message) -> dict:
    params = {
        "message": {
            "messageId": str(uuid.uuid4()),
            "role": "ROLE_USER",
            "parts": [{"text": text}],
            **message,
        },
        "configuration": {"returnImmediately": True},
    }
    response = await client.post(f"{base}/", json=rpc("SendMessage", params))
    return response.json()["result"]["task"]


async def wait_state(client: httpx.AsyncClient, base: str, task_id: str, state: str) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        task = (await client.post(f"{base}/", json=rpc("GetTask", {"id": task_id}))).json()
        if task["result"]["status"]["state"] == state:
            return task["result"]
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{task_id} not {state}")


async def collect(
    client: httpx.AsyncClient,
    base: str,
    task_id: str,
    *,
    last_event_id: int | None = None,
    stop_after: int | None = None,
    opened: asyncio.Event | None = None,
) -> list[SSE]:
    """A SubscribeToTask stream on `base`, read to its end (or `stop_after` events, then
    dropped). Comments are skipped."""
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
    events: list[SSE] = []
    stream = http_events(
        client, "POST", f"{base}/", json=rpc("SubscribeToTask", {"id": task_id}), headers=headers
    )
    try:
        async for response, event in stream:
            assert response.status_code == 200, event
            if event.is_comment:
                continue
            events.append(event)
            if opened is not None:
                opened.set()
            if stop_after is not None and len(events) >= stop_after:
                break
    finally:
        await stream.aclose()
    return events


def results(events: list[SSE]) -> list[dict]:
    return [e.data["result"] for e in events]


def shape(events: list[SSE]) -> list[str]:
    out = []
    for r in results(events):
        (key,) = r
        out.append(r[key]["status"]["state"][11:] if key == "statusUpdate" else key)
    return out


def streamed_seqs(task_id: str) -> list[int]:
    """The seqs a stream carries: every event but `message` history entries."""
    return list(
        TaskEvent.objects.filter(task_id=task_id)
        .exclude(kind="message")
        .order_by("seq")
        .values_list("seq", flat=True)
    )


# --- Across instances and the worker --------------------------------------------------------


def test_a_stream_on_one_instance_sees_what_the_other_instance_and_the_worker_wrote(
    instances, agent
):
    a, b = instances.a.url, instances.b.url

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            # Created through B, moved by the worker; watched on A.
            task = await send(client, b, "work 1; ask; chunks 2")
            first = await collect(client, a, task["id"])
            # Interrupted: A's next subscription stays open until the task settles again,
            # which follows a message sent through B and the worker's work.
            opened = asyncio.Event()
            second = asyncio.create_task(collect(client, a, task["id"], opened=opened))
            await asyncio.wait_for(opened.wait(), 10)
            await send(client, b, "go on", taskId=task["id"])
            second = await second
            # A transition made through B (cancel) reaches a stream on A.
            other = await send(client, a, "ask")
            await wait_state(client, a, other["id"], "TASK_STATE_INPUT_REQUIRED")
            opened = asyncio.Event()
            third = asyncio.create_task(collect(client, a, other["id"], opened=opened))
            await asyncio.wait_for(opened.wait(), 10)
            canceled = await client.post(f"{b}/", json=rpc("CancelTask", {"id": other["id"]}))
            assert canceled.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED"
            return task["id"], first, second, other["id"], await third

    task_id, first, second, other_id, third = run(scenario())
    assert shape(first)[-1] == "INPUT_REQUIRED"
    assert shape(second) == [
        "task",
        "WORKING",
        "artifactUpdate",
        "artifactUpdate",
        "artifactUpdate",
        "COMPLETED",
    ]
    assert results(second)[0]["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    # Together the two streams carried every streamable event exactly once, in order.
    ids = [e.id for e in first[1:]] + [e.id for e in second[1:]]
    assert ids == [s for s in streamed_seqs(task_id) if s > first[0].id]
    assert shape(third) == ["task", "CANCELED"]
    assert Task.objects.get(pk=other_id).state == "TASK_STATE_CANCELED"


def test_a_hundred_streams_of_one_task_receive_identical_sequences(instances, agent):
    a, b = instances.a.url, instances.b.url

    async def scenario():
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            task = await send(client, a, "ask; chunks 5")
            await wait_state(client, a, task["id"], "TASK_STATE_INPUT_REQUIRED")
            openings = [asyncio.Event() for _ in range(100)]
            streams = [
                asyncio.create_task(collect(client, (a, b)[i % 2], task["id"], opened=openings[i]))
                for i in range(100)
            ]
            await asyncio.wait_for(asyncio.gather(*(o.wait() for o in openings)), 30)
            await send(client, b, "now", taskId=task["id"])
            return task["id"], await asyncio.wait_for(asyncio.gather(*streams), 60)

    task_id, sequences = run(scenario())
    rendered = {tuple((e.id, repr(e.data["result"])) for e in seq) for seq in sequences}
    assert len(rendered) == 1, "streams differ"
    (only,) = rendered
    seqs = [seq for seq, _ in only]
    assert seqs[1:] == [s for s in streamed_seqs(task_id) if s > seqs[0]]
    assert shape(sequences[0])[-1] == "COMPLETED"


def test_a_dropped_stream_resumed_on_the_other_instance_misses_nothing(instances, agent):
    a, b = instances.a.url, instances.b.url

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            task = await send(client, a, "ask; chunks 3; work 1; chunks 3")
            await wait_state(client, a, task["id"], "TASK_STATE_INPUT_REQUIRED")
            opened = asyncio.Event()
            dropped = asyncio.create_task(
                collect(client, a, task["id"], stop_after=3, opened=opened)
            )
            await asyncio.wait_for(opened.wait(), 10)
            await send(client, a, "continue", taskId=task["id"])
            before = await dropped  # the snapshot, WORKING and one chunk, then gone
            after = await collect(client, b, task["id"], last_event_id=before[-1].id)
            return task["id"], before, after

    task_id, before, after = run(scenario())
    ids = [e.id for e in before] + [e.id for e in after]
    assert len(ids) == len(set(ids)), "duplicate"
    assert ids[1:] == [s for s in streamed_seqs(task_id) if s > ids[0]], "gap"
    assert shape(after)[-1] == "COMPLETED"
    assert "task" not in shape(after)  # a resume replays events, not a new snapshot


# --- The official SDK client ----------------------------------------------------------------


async def sdk_client(http: httpx.AsyncClient, url: str, binding: str, version: str):
    factory = ClientFactory(
        ClientConfig(streaming=True, supported_protocol_bindings=[binding], httpx_client=http)
    )
    card = await A2ACardResolver(http, url).get_agent_card()
    assert card.capabilities.streaming
    if version == "0.3":
        card = only_interfaces(card, "0.3")
    return factory.create(card)


@pytest.mark.parametrize("version", ["1.0", "0.3"])
@pytest.mark.parametrize("binding", [JSONRPC, HTTP_JSON])
def test_sdk_client_streams_and_subscribes(instances, agent, binding, version):
    a, b = instances.a.url, instances.b.url

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as http:
            client = await sdk_client(http, a, binding, version)
            request = a2a_pb2.SendMessageRequest(message=user_message("chunks 2"))
            streamed = [event async for event in client.send_message(request)]

            reply = a2a_pb2.SendMessageRequest(message=user_message("message"))
            replied = [event async for event in client.send_message(reply)]

            asked = [
                e
                async for e in client.send_message(
                    a2a_pb2.SendMessageRequest(message=user_message("ask"))
                )
            ]
            task_id = asked[0].task.id
            # Resubscribe through the other instance while a message moves the task on.
            other = await sdk_client(http, b, binding, version)
            subscription = other.subscribe(a2a_pb2.SubscribeToTaskRequest(id=task_id))
            first = await anext(subscription)
            await send(http, a, "onwards", taskId=task_id)
            rest = [event async for event in subscription]
            await client.close()
            await other.close()
            return streamed, replied, asked, first, rest

    streamed, replied, asked, first, rest = run(scenario())
    kinds = [e.WhichOneof("payload") for e in streamed]
    assert kinds[0] == "task"
    assert set(kinds[1:]) <= {"status_update", "artifact_update"}
    assert streamed[-1].status_update.status.state == S.TASK_STATE_COMPLETED
    chunks = [
        texts(e.artifact_update.artifact.parts)
        for e in streamed
        if e.HasField("artifact_update") and e.artifact_update.artifact.name == "chunks"
    ]
    assert chunks == [["chunk 1 of 2"], ["chunk 2 of 2"]]
    assert [e.WhichOneof("payload") for e in replied] == ["message"]
    assert texts(replied[0].message.parts) == ["message"]
    assert asked[-1].status_update.status.state == S.TASK_STATE_INPUT_REQUIRED
    assert first.task.id == asked[0].task.id
    assert first.task.status.state == S.TASK_STATE_INPUT_REQUIRED
    assert rest[-1].status_update.status.state == S.TASK_STATE_COMPLETED
    assert texts(rest[-2].artifact_update.artifact.parts) == ["onwards"]


# --- Resources ----------------------------------------------------------------------------------


async def _open_raw_stream(host: str, port: int, path: str) -> tuple[Any, Any, bytes]:
    """A SubscribeToTask stream on a bare socket (1,000 httpx clients would cost the test
    more than the server): returns once the first event (the Task) has arrived."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    first = await reader.readuntil(b"\n\n")
    return reader, writer, first


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _connections_of_c() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [WEB_C])
        return cursor.fetchone()[0]


def test_a_thousand_open_streams_hold_no_connection_and_no_thread_each(instances, agent):
    c = instances.c
    pid = c.proc.pid
    count = 1000

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            task = await send(client, c.url, "ask")
            await wait_state(client, c.url, task["id"], "TASK_STATE_INPUT_REQUIRED")
        threads_before = _threads(pid)
        path = f"/tasks/{task['id']}:subscribe"
        sem = asyncio.Semaphore(200)

        async def one():
            async with sem:
                return await _open_raw_stream(live.HOST, c.port, path)

        started = time.monotonic()
        opened = await asyncio.gather(*(one() for _ in range(count)))
        opening = time.monotonic() - started
        await asyncio.sleep(0.5)  # let anything lazily started settle
        held = {"threads": _threads(pid), "connections": await asyncio.to_thread(_in_thread)}
        # Every stream is live: one cancel reaches all of them, and each ends.
        async with httpx.AsyncClient(timeout=30) as client:
            await client.post(f"{c.url}/", json=rpc("CancelTask", {"id": task["id"]}))

        async def tail(reader, writer) -> bytes:
            data = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            return data

        tails = await asyncio.gather(*(tail(r, w) for r, w, _ in opened))
        return threads_before, held, opening, [first for _, _, first in opened], tails

    threads_before, held, opening, firsts, tails = run(scenario())
    assert all(b"id: 3" in first and b'"task"' in first for first in firsts)
    assert all(b"TASK_STATE_CANCELED" in t for t in tails)
    # Pooled ORM connections (one per ORM thread at most) plus the hub's LISTEN connection.
    assert held["connections"] <= C_ORM_THREADS + 1, held
    # No thread per stream: at most the ORM pool filling up.
    assert held["threads"] <= threads_before + C_ORM_THREADS, (threads_before, held)
    print(f"1000 streams opened in {opening:.2f}s; held {held}")  # noqa: T201


def _in_thread() -> int:
    try:
        return _connections_of_c()
    finally:
        connection.close()


# --- Shutdown -------------------------------------------------------------------------------


def test_sigterm_ends_open_streams_with_a_retry_hint_and_they_resume_elsewhere(
    instances, agent, tmp_path
):
    a, b = instances.a.url, instances.b.url
    doomed = live.start_web(
        tmp_path, name="web-d", A2A_SHUTDOWN_GRACE_SECONDS="0.2", A2A_ORM_THREADS="2"
    )
    try:

        async def scenario():
            async with httpx.AsyncClient(timeout=30) as client:
                task = await send(client, a, "ask; chunks 2")
                await wait_state(client, a, task["id"], "TASK_STATE_INPUT_REQUIRED")
                path = f"/tasks/{task['id']}:subscribe"
                reader, writer, first = await _open_raw_stream(live.HOST, doomed.port, path)
                os.kill(doomed.proc.pid, signal.SIGTERM)
                tail = await asyncio.wait_for(reader.read(), 15)
                writer.close()
                seen = int(first.split(b"id: ", 1)[1].split(b"\n", 1)[0])
                opened = asyncio.Event()
                resumed = asyncio.create_task(
                    collect(client, b, task["id"], last_event_id=seen, opened=opened)
                )
                await send(client, a, "go", taskId=task["id"])
                return task["id"], seen, tail, await asyncio.wait_for(resumed, 20)

        task_id, seen, tail, resumed = run(scenario())
        assert b"retry: 1000" in tail
        # And the process is gone, after a clean shutdown: uvicorn re-raises the SIGTERM it
        # was stopped by once the application has shut down (a crash would exit otherwise).
        assert doomed.proc.popen.wait(timeout=15) == -signal.SIGTERM, doomed.proc.log()[-3000:]
        assert "Application shutdown complete." in doomed.proc.log()
        assert [e.id for e in resumed] == [s for s in streamed_seqs(task_id) if s > seen]
        assert shape(resumed)[-1] == "COMPLETED"
    finally:
        doomed.stop()
