"""SSE streams on the protocol app, in-process (tests/sse.py drives the ASGI app): order, end
rules, resume, v0.3 shapes, errors, keep-alives, disconnects, the stream cap and shutdown.

Tasks belong to an `external` agent and are moved by the lifecycle services from a thread, as
a worker would (NOTIFY at commit wakes this loop's event hub). Live processes, other
instances and the SDK client are in tests/interop/test_streaming_live.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from django.db import connection

from a2a_platform.asgi import application
from a2a_platform.protocol import sse
from agents.services import api_key_create
from tasks import services
from tasks.event_hub import get_hub
from tasks.models import Task, TaskEvent
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message
from tests.sse import SSE, ASGIStream, open_streams, streams_reset

S = TaskState


@pytest.fixture
def agent(wire):
    return AgentFactory(slug="streamer", is_default=True, executor="external")


@pytest.fixture(autouse=True)
def _fresh_stream_registry():
    streams_reset()
    yield
    streams_reset()


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    """A scenario in its own event loop, with the event hub a web process has."""

    async def main() -> Any:
        hub = get_hub()
        assert await hub.start(), "the event hub did not connect"
        try:
            return await scenario()
        finally:
            await hub.stop()

    return asyncio.run(main())


async def db(fn: Callable[[], Any]) -> Any:
    """A service call from another thread (a worker, another instance)."""

    def call() -> Any:
        try:
            return fn()
        finally:
            connection.close()

    return await asyncio.to_thread(call)


def new_task(agent, text: str = "hi") -> Task:
    return task_create(agent=agent, owner="anonymous", message=user_message(text))


def move(task_id, state: TaskState, message: str | None = None):
    return lambda: services.task_transition(task_id=task_id, to_state=state, message=message)


def chunk(task_id, text: str, *, append: bool = False, last: bool = False):
    return lambda: services.task_add_artifact(
        task_id=task_id,
        artifact={"artifactId": "a1", "parts": [{"text": text}]},
        append=append,
        last_chunk=last,
    )


def rpc(method: str, params: dict, id_: Any = 7) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


async def subscribe(task_id, *, binding: str = "jsonrpc", headers: dict | None = None, **kw):
    if binding == "jsonrpc":
        stream = ASGIStream(
            application,
            "POST",
            "/",
            json_body=rpc("SubscribeToTask", {"id": str(task_id)}),
            headers=headers,
            **kw,
        )
    else:
        stream = ASGIStream(application, "GET", f"/tasks/{task_id}:subscribe", headers=headers)
    return await stream.open()


def result(event: SSE, binding: str = "jsonrpc") -> dict:
    """The StreamResponse an event carries."""
    if binding == "jsonrpc":
        assert event.data["jsonrpc"] == "2.0"
        return event.data["result"]
    return event.data


def kinds(events: list[SSE], binding: str = "jsonrpc") -> list[str]:
    out = []
    for e in events:
        (key,) = result(e, binding)
        if key == "statusUpdate":
            out.append(result(e, binding)[key]["status"]["state"].removeprefix("TASK_STATE_"))
        else:
            out.append(key)
    return out


async def waiting_on_hub(task_id) -> int:
    return len(get_hub()._waiters.get(str(task_id), ()))


async def until_db(predicate: Callable[[], Any], timeout: float = 5) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await db(predicate):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.02)


async def until(predicate: Callable[[], Any], timeout: float = 5) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


# --- Order and end rules ----------------------------------------------------------------------


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
def test_subscribe_sends_the_task_then_updates_in_order_and_ends_on_terminal(agent, binding):
    task = new_task(agent)

    async def scenario():
        stream = await subscribe(task.pk, binding=binding)
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        first = await stream.next()
        assert first.id == 1
        snap = result(first, binding)["task"]
        assert snap["id"] == str(task.pk)
        assert snap["status"]["state"] == "TASK_STATE_SUBMITTED"
        assert snap["history"][0]["parts"] == [{"text": "hi"}]
        await db(move(task.pk, S.WORKING))
        await db(chunk(task.pk, "one"))
        await db(chunk(task.pk, "two", append=True, last=True))
        await db(move(task.pk, S.WORKING, "progress"))
        await db(move(task.pk, S.COMPLETED))
        rest = await stream.until_closed()
        return [first, *rest]

    events = run(scenario)
    assert [e.id for e in events] == [1, 2, 3, 4, 5, 6]
    assert kinds(events, binding) == [
        "task",
        "WORKING",
        "artifactUpdate",
        "artifactUpdate",
        "WORKING",
        "COMPLETED",
    ]
    stored = list(TaskEvent.objects.filter(task=task).order_by("seq"))
    # Exactly the stored StreamResponses, in seq order.
    assert [result(e, binding) for e in events[1:]] == [ev.payload for ev in stored[1:]]
    if binding == "jsonrpc":
        assert {e.data["id"] for e in events} == {7}


def test_message_events_are_history_and_not_streamed(agent):
    task = new_task(agent)

    async def scenario():
        stream = await subscribe(task.pk)
        await stream.next()
        await db(move(task.pk, S.WORKING))
        await db(
            lambda: services.task_append_message(task_id=task.pk, message=user_message("more"))
        )
        await db(move(task.pk, S.COMPLETED))
        return await stream.until_closed()

    events = run(scenario)
    assert [e.id for e in events] == [2, 4]  # seq 3 is the appended message
    assert kinds(events) == ["WORKING", "COMPLETED"]


def test_stream_ends_right_after_an_interrupted_state(agent):
    task = new_task(agent)

    async def scenario():
        stream = await subscribe(task.pk)
        await stream.next()
        await db(move(task.pk, S.WORKING))
        await db(move(task.pk, S.INPUT_REQUIRED, "which one?"))
        events = await stream.until_closed()
        # The task goes on; the closed stream never sees it.
        await db(move(task.pk, S.WORKING))
        return events

    events = run(scenario)
    assert kinds(events) == ["WORKING", "INPUT_REQUIRED"]
    assert result(events[-1])["statusUpdate"]["status"]["message"]["parts"] == [
        {"text": "which one?"}
    ]


def test_subscription_on_an_interrupted_task_waits_for_the_next_settled_state(agent):
    task = new_task(agent)
    services.task_transition(task_id=task.pk, to_state=S.AUTH_REQUIRED, message="log in")

    async def scenario():
        stream = await subscribe(task.pk)
        first = await stream.next()
        assert result(first)["task"]["status"]["state"] == "TASK_STATE_AUTH_REQUIRED"
        await asyncio.sleep(0.2)
        await db(move(task.pk, S.WORKING))
        await db(move(task.pk, S.INPUT_REQUIRED))
        return await stream.until_closed()

    assert kinds(run(scenario)) == ["WORKING", "INPUT_REQUIRED"]


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
def test_subscribe_to_a_terminal_task_is_unsupported_operation(agent, binding):
    task = new_task(agent)
    services.task_transition(task_id=task.pk, to_state=S.REJECTED)

    async def scenario():
        stream = await subscribe(task.pk, binding=binding)
        assert not stream.is_stream
        return stream.status, await stream.json()

    status, body = run(scenario)
    if binding == "jsonrpc":
        assert status == 200
        assert body["id"] == 7
        assert body["error"]["code"] == -32004
        assert body["error"]["data"][0]["reason"] == "UNSUPPORTED_OPERATION"
    else:
        assert status == 400
        assert body["error"]["details"][0]["reason"] == "UNSUPPORTED_OPERATION"


def test_subscribe_errors_before_the_first_event_are_plain_responses(agent, wire):
    key = api_key_create(agent=agent, name="owner")
    # Another principal's task: an anonymous caller must not learn it exists.
    foreign = task_create(agent=agent, owner=key.key.principal, message=user_message())

    async def scenario():
        out = {}
        cases = (("unknown", uuid.uuid4()), ("malformed", "not-a-uuid"), ("foreign", foreign.pk))
        for name, task_id in cases:
            stream = await subscribe(task_id)
            out[name] = (stream.status, await stream.json())
        stream = await ASGIStream(
            application, "POST", "/", json_body=rpc("SubscribeToTask", {})
        ).open()
        out["no id"] = (stream.status, await stream.json())
        return out

    answers = run(scenario)
    for name in ("unknown", "malformed", "foreign"):
        status, body = answers[name]
        assert status == 200, name
        assert body["error"]["code"] == -32001, name
    assert answers["no id"][1]["error"]["code"] == -32602


def test_refused_stream_leaves_no_waiter_and_no_slot(agent):
    task = new_task(agent)
    services.task_transition(task_id=task.pk, to_state=S.CANCELED)

    async def scenario():
        stream = await subscribe(task.pk)
        await stream.json()
        return await waiting_on_hub(task.pk), open_streams()

    assert run(scenario) == (0, 0)


# --- SendStreamingMessage -----------------------------------------------------------------------


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
def test_send_streaming_message_task_first_then_the_agents_events(agent, binding):
    params = {"message": user_message("stream me")}

    async def scenario():
        if binding == "jsonrpc":
            stream = ASGIStream(
                application, "POST", "/", json_body=rpc("SendStreamingMessage", params)
            )
        else:
            stream = ASGIStream(application, "POST", "/message:stream", json_body=params)
        await stream.open()
        assert stream.is_stream
        await until_db(lambda: Task.objects.exists())
        task = await db(lambda: Task.objects.get())
        # The Task waits for the agent's first move (it could be a direct Message reply).
        with pytest.raises(TimeoutError):
            await stream.next(timeout=0.3)
        await db(move(task.pk, S.WORKING))
        await db(chunk(task.pk, "out", last=True))
        await db(move(task.pk, S.COMPLETED))
        return task, await stream.until_closed()

    task, events = run(scenario)
    assert [e.id for e in events] == [1, 2, 3, 4]
    assert kinds(events, binding) == ["task", "WORKING", "artifactUpdate", "COMPLETED"]
    snap = result(events[0], binding)["task"]
    assert snap["id"] == str(task.pk)
    assert snap["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert snap["history"][0]["parts"] == [{"text": "stream me"}]


def test_send_streaming_message_answered_with_a_message_is_one_message(agent):
    params = {"message": user_message("hello")}

    async def scenario():
        stream = await ASGIStream(
            application, "POST", "/", json_body=rpc("SendStreamingMessage", params)
        ).open()
        await until_db(lambda: Task.objects.exists())
        task = await db(lambda: Task.objects.get())
        await db(lambda: services.task_reply_with_message(task_id=task.pk, message="hi back"))
        return await stream.until_closed()

    events = run(scenario)
    assert len(events) == 1
    message = result(events[0])["message"]
    assert message["role"] == "ROLE_AGENT"
    assert message["parts"] == [{"text": "hi back"}]
    assert events[0].id == 2


def test_send_streaming_message_continues_an_interrupted_task(agent):
    task = new_task(agent)
    services.task_transition(task_id=task.pk, to_state=S.INPUT_REQUIRED, message="more?")
    follow_up = user_message("here", taskId=str(task.pk))

    async def scenario():
        stream = await ASGIStream(
            application, "POST", "/", json_body=rpc("SendStreamingMessage", {"message": follow_up})
        ).open()
        await until_db(lambda: TaskEvent.objects.filter(task=task).count() == 3)
        await db(move(task.pk, S.WORKING))
        await db(move(task.pk, S.COMPLETED))
        return await stream.until_closed()

    events = run(scenario)
    # The snapshot as of the write (INPUT_REQUIRED with the new message), then what followed.
    assert kinds(events) == ["task", "WORKING", "COMPLETED"]
    assert [e.id for e in events] == [3, 4, 5]
    snap = result(events[0])["task"]
    assert snap["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert [m["parts"][0]["text"] for m in snap["history"]] == ["hi", "here"]


def test_send_streaming_message_registers_an_inline_push_config(agent, settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    params = {
        "message": user_message("with a webhook"),
        "configuration": {
            "taskPushNotificationConfig": {"id": "hook", "url": "http://127.0.0.1:9/hook"}
        },
    }

    async def scenario():
        stream = await ASGIStream(
            application, "POST", "/", json_body=rpc("SendStreamingMessage", params)
        ).open()
        assert stream.is_stream
        await until_db(lambda: Task.objects.exists())
        task = await db(lambda: Task.objects.get())
        await db(move(task.pk, S.COMPLETED))
        await stream.until_closed()
        return task

    task = run(scenario)
    # Written in the task's transaction, through the same path as SendMessage.
    assert list(task.push_configs.values_list("config_id", flat=True)) == ["hook"]


def test_send_streaming_message_errors_write_nothing(agent):
    before = Task.objects.count()

    async def scenario():
        bad = {"message": {**user_message(), "role": "ROLE_AGENT"}}
        stream = await ASGIStream(
            application, "POST", "/", json_body=rpc("SendStreamingMessage", bad)
        ).open()
        return await stream.json()

    assert run(scenario)["error"]["code"] == -32602
    assert Task.objects.count() == before


def test_send_streaming_message_as_a_notification_writes_and_answers_204(agent):
    params = {"message": user_message("fire and forget")}

    async def scenario():
        body = {"jsonrpc": "2.0", "method": "SendStreamingMessage", "params": params}
        stream = await ASGIStream(application, "POST", "/", json_body=body).open()
        await asyncio.wait_for(stream.task, 5)
        return stream.status, open_streams()

    assert run(scenario) == (204, 0)
    assert Task.objects.get().messages.get().parts == [{"text": "fire and forget"}]


def test_streaming_methods_are_refused_inside_a_batch(agent, wire):
    batch = [rpc("SendStreamingMessage", {"message": user_message()})]
    answer = wire.request("POST", "/", json=batch).json()
    assert answer[0]["error"]["code"] == -32600
    assert Task.objects.count() == 0


# --- Concurrent streams -------------------------------------------------------------------------


def test_concurrent_streams_get_identical_sequences_and_closing_one_affects_none(agent):
    task = new_task(agent)

    async def scenario():
        streams = [await subscribe(task.pk) for _ in range(20)]
        for s in streams:
            assert (await s.next()).id == 1
        await db(move(task.pk, S.WORKING))
        for s in streams:
            assert (await s.next()).id == 2
        await streams[0].disconnect()
        for i in range(5):
            await db(chunk(task.pk, f"c{i}", append=i > 0, last=i == 4))
        await db(move(task.pk, S.COMPLETED))
        return [await s.until_closed() for s in streams[1:]]

    sequences = run(scenario)
    payloads = {tuple((e.id, str(result(e))) for e in seq) for seq in sequences}
    assert len(payloads) == 1
    (only,) = payloads
    assert [seq for seq, _ in only] == [3, 4, 5, 6, 7, 8]


def test_streams_of_one_task_share_one_read_per_wake_up(agent, monkeypatch):
    from a2a_platform.protocol import streams as streams_module

    task = new_task(agent)
    reads = []
    original = streams_module._read_rows

    def counting(task_id, after):
        reads.append(after)
        return original(task_id, after)

    monkeypatch.setattr(streams_module, "_read_rows", counting)

    async def scenario():
        streams = [await subscribe(task.pk) for _ in range(30)]
        for s in streams:
            await s.next()
        reads.clear()
        await db(move(task.pk, S.COMPLETED))
        for s in streams:
            await s.until_closed()

    run(scenario)
    assert len(reads) < 30 / 2, reads  # shared, not one per stream


# --- Resume ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
def test_resume_with_last_event_id_replays_what_was_missed_then_continues(agent, binding):
    task = new_task(agent)

    async def scenario():
        stream = await subscribe(task.pk, binding=binding)
        seen = [await stream.next()]
        await db(move(task.pk, S.WORKING))
        seen.append(await stream.next())
        await stream.disconnect()  # dropped
        await db(chunk(task.pk, "while away"))
        await db(move(task.pk, S.WORKING, "still"))
        again = await subscribe(
            task.pk, binding=binding, headers={"Last-Event-ID": str(seen[-1].id)}
        )
        seen.append(await again.next())
        seen.append(await again.next())
        await db(move(task.pk, S.COMPLETED))
        seen += await again.until_closed()
        return seen

    events = run(scenario)
    assert [e.id for e in events] == [1, 2, 3, 4, 5]  # no gap, no duplicate, no new snapshot
    assert kinds(events, binding) == ["task", "WORKING", "artifactUpdate", "WORKING", "COMPLETED"]


def test_resume_after_the_task_finished_replays_then_closes(agent):
    task = new_task(agent)
    services.task_transition(task_id=task.pk, to_state=S.WORKING)
    services.task_add_artifact(
        task_id=task.pk, artifact={"artifactId": "x", "parts": [{"text": "r"}]}, last_chunk=True
    )
    services.task_transition(task_id=task.pk, to_state=S.FAILED)

    async def scenario():
        out = {}
        for cursor in (1, 3, 4):
            stream = await subscribe(task.pk, headers={"Last-Event-ID": str(cursor)})
            out[cursor] = await stream.until_closed()
        return out

    replays = run(scenario)
    assert [e.id for e in replays[1]] == [2, 3, 4]
    assert kinds(replays[1]) == ["WORKING", "artifactUpdate", "FAILED"]
    assert [e.id for e in replays[3]] == [4]
    assert replays[4] == []  # nothing after the end: closed at once


@pytest.mark.parametrize("value", ["x", "-1", "1.5", "99999999999", "9"])
def test_bad_last_event_id_is_invalid_params(agent, value):
    task = new_task(agent)  # last seq 1: "9" is beyond it

    async def scenario():
        stream = await subscribe(task.pk, headers={"Last-Event-ID": value})
        return await stream.json()

    error = run(scenario)["error"]
    assert error["code"] == -32602
    assert error["data"][1]["fieldViolations"][0]["field"] == "Last-Event-ID"


def test_idempotent_retry_of_a_stream_resumes_the_same_task(agent):
    key = api_key_create(agent=agent, name="client")
    auth = {"Authorization": f"Bearer {key.token}"}
    params = {"message": user_message("once")}

    async def scenario():
        first = await ASGIStream(
            application, "POST", "/", json_body=rpc("SendStreamingMessage", params), headers=auth
        ).open()
        await until_db(lambda: Task.objects.exists())
        task = await db(lambda: Task.objects.get())
        await db(move(task.pk, S.WORKING))
        seen = [await first.next(), await first.next()]
        await first.disconnect()
        await db(move(task.pk, S.COMPLETED))
        retry = await ASGIStream(
            application,
            "POST",
            "/",
            json_body=rpc("SendStreamingMessage", params),
            headers={**auth, "Last-Event-ID": str(seen[-1].id)},
        ).open()
        return seen + await retry.until_closed()

    events = run(scenario)
    assert [e.id for e in events] == [1, 2, 3]
    assert kinds(events) == ["task", "WORKING", "COMPLETED"]
    assert Task.objects.count() == 1


# --- v0.3 --------------------------------------------------------------------------------------


def test_v03_json_rpc_stream_events_have_kind_and_final(agent):
    params = {
        "message": {
            "kind": "message",
            "messageId": str(uuid.uuid4()),
            "role": "user",
            "parts": [{"kind": "text", "text": "legacy"}],
        }
    }

    async def scenario():
        stream = await ASGIStream(
            application, "POST", "/", json_body=rpc("message/stream", params)
        ).open()
        await until_db(lambda: Task.objects.exists())
        task = await db(lambda: Task.objects.get())
        await db(move(task.pk, S.WORKING))
        await db(chunk(task.pk, "v03", last=True))
        await db(move(task.pk, S.INPUT_REQUIRED, "more?"))
        sent = await stream.until_closed()
        again = await ASGIStream(
            application, "POST", "/", json_body=rpc("tasks/resubscribe", {"id": str(task.pk)})
        ).open()
        first = await again.next()
        await db(move(task.pk, S.WORKING))
        await db(move(task.pk, S.COMPLETED))
        return sent, [first, *await again.until_closed()]

    sent, resubscribed = run(scenario)
    results = [e.data["result"] for e in sent]
    assert [r["kind"] for r in results] == [
        "task",
        "status-update",
        "artifact-update",
        "status-update",
    ]
    assert results[0]["status"]["state"] == "submitted"
    assert results[1]["status"]["state"] == "working"
    assert results[1]["final"] is False
    assert results[2]["artifact"]["parts"] == [{"kind": "text", "text": "v03"}]
    # v0.3's `final` marks the event that ends the stream (here: interrupted).
    assert results[3]["status"]["state"] == "input-required"
    assert results[3]["final"] is True
    again = [e.data["result"] for e in resubscribed]
    assert [r["kind"] for r in again] == ["task", "status-update", "status-update"]
    assert [r.get("final") for r in again[1:]] == [False, True]
    assert again[2]["status"]["state"] == "completed"


def test_v03_rest_stream_events_are_v03_stream_responses(agent):
    task = new_task(agent)

    async def scenario():
        stream = await ASGIStream(application, "GET", f"/v0.3/v1/tasks/{task.pk}:subscribe").open()
        first = await stream.next()
        await db(move(task.pk, S.COMPLETED))
        return [first, *await stream.until_closed()]

    events = run(scenario)
    assert events[0].data["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    update = events[1].data["statusUpdate"]
    assert update["status"]["state"] == "TASK_STATE_COMPLETED"
    assert update["final"] is True


# --- Errors, keep-alives, disconnects, the cap, shutdown ------------------------------------------


def test_mid_stream_error_is_an_error_event_then_the_end(agent, monkeypatch):
    from a2a_platform.protocol import streams as streams_module

    task = new_task(agent)

    def broken(task_id, after):
        raise RuntimeError("database went away")

    async def scenario():
        stream = await subscribe(task.pk)
        await stream.next()
        monkeypatch.setattr(streams_module, "_read_rows", broken)
        await db(move(task.pk, S.WORKING))
        return await stream.until_closed()

    events = run(scenario)
    assert len(events) == 1
    assert events[0].event == "error"
    assert events[0].data["id"] == 7
    assert events[0].data["error"]["code"] == -32603


def test_idle_stream_gets_keep_alive_comments(agent, settings):
    settings.A2A_SSE_KEEPALIVE_SECONDS = 0.1
    task = new_task(agent)

    async def scenario():
        stream = await subscribe(task.pk)
        await stream.next()
        comments = [await stream.next(comments=True) for _ in range(3)]
        await stream.disconnect()
        return comments

    assert [c.comment for c in run(scenario)] == ["keep-alive"] * 3


def test_client_disconnect_releases_everything_promptly(agent):
    task = new_task(agent)

    async def scenario():
        streams = [await subscribe(task.pk) for _ in range(5)]
        for s in streams:
            await s.next()
        await until(lambda: open_streams() == 5)
        waiting = await waiting_on_hub(task.pk)
        for s in streams:
            await s.disconnect(timeout=1)
        return waiting, await waiting_on_hub(task.pk), open_streams()

    waiting, after, open_after = run(scenario)
    assert waiting == 5
    assert (after, open_after) == (0, 0)


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
def test_streams_past_the_cap_get_a_retryable_503(agent, settings, binding):
    settings.A2A_MAX_STREAMS = 2
    task = new_task(agent)

    async def scenario():
        held = [await subscribe(task.pk, binding=binding) for _ in range(2)]
        refused = await subscribe(task.pk, binding=binding)
        answer = (refused.status, refused.headers, await refused.json())
        await held[0].disconnect()
        admitted = await subscribe(task.pk, binding=binding)
        ok = admitted.is_stream
        for s in (held[1], admitted):
            await s.disconnect()
        return answer, ok

    (status, headers, body), admitted_after = run(scenario)
    assert status == 503
    assert headers["retry-after"] == "5"
    details = body["error"]["data"] if binding == "jsonrpc" else body["error"]["details"]
    assert details[0]["reason"] == "TOO_MANY_STREAMS"
    assert admitted_after


def test_a_refused_send_stream_writes_nothing(agent, settings):
    settings.A2A_MAX_STREAMS = 0

    async def scenario():
        stream = await ASGIStream(
            application, "POST", "/message:stream", json_body={"message": user_message()}
        ).open()
        return stream.status

    assert run(scenario) == 503
    assert Task.objects.count() == 0


def test_shutdown_ends_open_streams_with_a_retry_hint(agent, settings):
    settings.A2A_SSE_SHUTDOWN_RETRY_MS = 1500
    task = new_task(agent)

    async def scenario():
        streams = [await subscribe(task.pk) for _ in range(3)]
        for s in streams:
            await s.next()
        assert sse.begin_shutdown() == 3
        tails = [await s.until_closed() for s in streams]
        late = await subscribe(task.pk)
        return tails, late.status, await late.json()

    tails, late_status, late_body = run(scenario)
    for tail in tails:
        assert [e.retry for e in tail] == [1500]
    assert late_status == 503
    assert late_body["error"]["data"][0]["reason"] == "SHUTTING_DOWN"


def test_streaming_switched_off_by_the_operator(agent, wire):
    agent.streaming_enabled = False
    agent.save()
    task = new_task(agent)
    card = wire.request("GET", "/.well-known/agent-card.json").json()
    assert card["capabilities"]["streaming"] is False

    async def scenario():
        stream = await subscribe(task.pk)
        return await stream.json()

    assert run(scenario)["error"]["code"] == -32004


def test_card_says_streaming_while_the_hub_is_connected(agent, wire):
    card = wire.request("GET", "/.well-known/agent-card.json")
    assert card.json()["capabilities"]["streaming"] is True


def test_hub_state_flips_the_card_etag_and_readyz(agent, settings):
    """The card's `streaming` follows this process's hub (and its ETag with it); /readyz,
    a Django view running in a thread, reads the hub's process-wide flag."""
    settings.A2A_READINESS_CACHE_SECONDS = 0

    async def get(path: str) -> tuple[int, dict, dict]:
        stream = await ASGIStream(application, "GET", path).open()
        await asyncio.wait_for(stream.task, 10)
        return stream.status, stream.headers, json.loads(stream.raw)

    async def scenario():
        up = await get("/.well-known/agent-card.json")
        ready = await get("/readyz")
        await get_hub().stop()
        down = await get("/.well-known/agent-card.json")
        not_ready = await get("/readyz")
        await get_hub().start()
        return up, ready, down, not_ready

    up, ready, down, not_ready = run(scenario)
    assert up[0] == down[0] == 200  # ready once: the card stays up, its capability flips
    assert up[2]["capabilities"]["streaming"] is True
    assert down[2]["capabilities"]["streaming"] is False
    assert up[1]["etag"] != down[1]["etag"]
    assert ready[2]["checks"]["event_hub"]["ok"] is True
    assert not_ready[0] == 503
    assert not_ready[2]["checks"]["event_hub"] == {"ok": False, "detail": "not connected"}


def test_hub_state_flips_the_card_while_the_agent_and_readiness_are_cached(agent, settings):
    """The card served again while the agent's row and readiness are the same cached
    objects (protocol/discovery.py) still follows the hub: it flips with it and back."""
    settings.A2A_AGENT_CACHE_SECONDS = 60
    settings.A2A_READINESS_CACHE_SECONDS = 60

    async def get() -> tuple[str, dict]:
        stream = await ASGIStream(application, "GET", "/.well-known/agent-card.json").open()
        await asyncio.wait_for(stream.task, 10)
        assert stream.status == 200
        return stream.headers["etag"], json.loads(stream.raw)

    async def scenario():
        up, again = await get(), await get()
        await get_hub().stop()
        down = await get()
        await get_hub().start()
        return up, again, down, await get()

    up, again, down, back = run(scenario)
    assert up == again
    assert up[1]["capabilities"]["streaming"] is True
    assert down[1]["capabilities"]["streaming"] is False
    assert down[0] != up[0]
    assert back == up
