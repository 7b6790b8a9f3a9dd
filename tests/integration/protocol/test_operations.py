"""Operation semantics on the protocol app: send (blocking and not), idempotency, history,
listing, tenancy, card caching and v0.3 shapes. Tasks are moved by the lifecycle services
(an external-executor agent), so no worker is needed here; tests/interop runs the real one."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from django.db import connection
from starlette.requests import Request
from starlette.responses import Response

from a2a_platform.protocol import discovery
from a2a_platform.protocol.routes import resolve
from agents.services import agent_update, api_key_create
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.factories import AgentFactory, user_message
from tests.spies import spy


@pytest.fixture
def agent(transactional_db):
    return AgentFactory(slug="ops", is_default=True, executor="external")


@pytest.fixture
def key(agent):
    return api_key_create(agent=agent, name="client")


def _auth(key) -> dict:
    return {"Authorization": f"Bearer {key.token}"}


def _send(wire, *, text="hi", headers=None, path="/", **message):
    params = {
        "message": {**user_message(text), **message},
        "configuration": {"returnImmediately": True},
    }
    return wire.rpc("SendMessage", params, path=path, headers=headers)


def _later(delay: float, fn) -> threading.Thread:
    def run():
        time.sleep(delay)
        try:
            fn()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_send_message_return_immediately_returns_submitted_task(wire, agent):
    result = _send(wire)["result"]["task"]
    assert result["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert result["history"][0]["parts"] == [{"text": "hi"}]
    assert Task.objects.filter(pk=result["id"]).exists()


def test_blocking_send_message_waits_for_interrupted_state(wire, agent, settings):
    settings.A2A_SEND_MESSAGE_MAX_WAIT_SECONDS = 20

    def move():
        task = wait_for_task()
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        services.task_transition(task_id=task.pk, to_state=TaskState.INPUT_REQUIRED, message="?")

    def wait_for_task():
        for _ in range(100):
            task = Task.objects.first()
            if task:
                return task
            time.sleep(0.05)
        raise AssertionError("no task")

    thread = _later(0.3, move)
    started = time.monotonic()
    answer = wire.rpc("SendMessage", {"message": user_message("x")})
    thread.join()
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert task["status"]["message"]["parts"] == [{"text": "?"}]
    assert time.monotonic() - started < 10


def test_a_blocking_send_reads_its_new_task_only_once_the_task_moves(wire, agent, monkeypatch):
    # Subscribed to before it is written, a new task needs no read until its first wake-up.
    from tasks import selectors

    reads = spy(monkeypatch, selectors, "task_settled_snapshots")
    # The read that finds it settled brings the answer: no second read for it.
    snapshots = spy(monkeypatch, selectors, "task_snapshots_for_owner")
    moved_at: list[float] = []

    def finish():
        for _ in range(100):
            task = Task.objects.first()
            if task:
                break
            time.sleep(0.05)
        moved_at.append(time.monotonic())
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)

    thread = _later(0.5, finish)
    answer = wire.rpc("SendMessage", {"message": user_message("x")})
    thread.join()
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert reads, "the waiter read the task once woken"
    assert reads[0].at >= moved_at[0]
    assert snapshots == []


def test_blocking_sends_answered_together_read_their_answers_together(
    wire, agent, monkeypatch, settings
):
    # One commit answers five waiting tasks: their waiters wake in the same turn and read
    # in one statement, each its own task (and its own answer: its message echoed).
    from django.db import transaction

    from tasks import selectors

    settings.A2A_SEND_MESSAGE_MAX_WAIT_SECONDS = 20
    reads = spy(monkeypatch, selectors, "task_settled_snapshots")

    def answer_all():
        for _ in range(200):
            tasks = list(Task.objects.all())
            if len(tasks) == 5:
                break
            time.sleep(0.05)
        with transaction.atomic():
            for task in tasks:
                services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
                text = task.messages.get().parts[0]["text"]
                services.task_transition(
                    task_id=task.pk, to_state=TaskState.COMPLETED, message=f"re: {text}"
                )

    def send(i):
        body = {"jsonrpc": "2.0", "id": i, "method": "SendMessage"}
        body["params"] = {"message": user_message(f"m{i}")}
        return ("POST", "/", {"json": body})

    thread = _later(0.3, answer_all)
    answers = [r.json()["result"]["task"] for r in wire.concurrently([send(i) for i in range(5)])]
    thread.join()
    assert [a["status"]["state"] for a in answers] == ["TASK_STATE_COMPLETED"] * 5
    said = [a["status"]["message"]["parts"][0]["text"] for a in answers]
    assert said == [f"re: m{i}" for i in range(5)]
    assert len({a["id"] for a in answers}) == 5
    keys = [k for call in reads for k in call.kwargs["keys"]]
    assert sorted(str(k.task_pk) for k in keys) == sorted(a["id"] for a in answers)
    assert len(reads) < 5


def test_a_blocking_retry_is_answered_with_the_first_task_as_it_is_now(wire, agent, key, settings):
    # The retry writes nothing and waits on the first task, not on the id it chose for a new one.
    settings.A2A_SEND_MESSAGE_MAX_WAIT_SECONDS = 0.5
    params = {"message": user_message("same")}
    first = wire.rpc("SendMessage", params, headers=_auth(key))["result"]["task"]
    assert first["status"]["state"] == "TASK_STATE_SUBMITTED"  # the cap, not the answer
    services.task_transition(task_id=first["id"], to_state=TaskState.WORKING)
    services.task_transition(task_id=first["id"], to_state=TaskState.COMPLETED)
    again = wire.rpc("SendMessage", params, headers=_auth(key))["result"]["task"]
    assert again["id"] == first["id"]
    assert again["status"]["state"] == "TASK_STATE_COMPLETED"
    assert Task.objects.count() == 1


def test_blocking_send_message_returns_current_task_at_the_cap(wire, agent, settings):
    settings.A2A_SEND_MESSAGE_MAX_WAIT_SECONDS = 0.5
    answer = wire.rpc("SendMessage", {"message": user_message("x")})
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"


def test_blocking_send_message_answered_with_a_message(wire, agent):
    def reply():
        for _ in range(100):
            task = Task.objects.first()
            if task:
                services.task_reply_with_message(task_id=task.pk, message="pong")
                return
            time.sleep(0.05)

    thread = _later(0.2, reply)
    answer = wire.rpc("SendMessage", {"message": user_message("ping")})["result"]
    thread.join()
    assert "task" not in answer
    assert answer["message"]["parts"] == [{"text": "pong"}]
    assert answer["message"]["role"] == "ROLE_AGENT"


def test_idempotent_retry_for_authenticated_callers(wire, agent, key):
    msg = user_message("same")
    params = {"message": msg, "configuration": {"returnImmediately": True}}
    first = wire.rpc("SendMessage", params, headers=_auth(key))["result"]["task"]
    second = wire.rpc("SendMessage", params, headers=_auth(key))["result"]["task"]
    assert first["id"] == second["id"]
    assert Task.objects.count() == 1
    changed = {
        "message": {**msg, "parts": [{"text": "different"}]},
        "configuration": {"returnImmediately": True},
    }
    error = wire.rpc("SendMessage", changed, headers=_auth(key))["error"]
    assert error["code"] == -32602
    assert "messageId" in error["data"][1]["fieldViolations"][0]["field"]
    assert Task.objects.count() == 1


def test_anonymous_callers_get_no_dedupe(wire, agent):
    params = {"message": user_message("same"), "configuration": {"returnImmediately": True}}
    a = wire.rpc("SendMessage", params)["result"]["task"]["id"]
    b = wire.rpc("SendMessage", params)["result"]["task"]["id"]
    assert a != b


def test_multi_turn_continues_task_and_inherits_context(wire, agent, key):
    first = _send(wire, headers=_auth(key))["result"]["task"]
    services.task_transition(task_id=first["id"], to_state=TaskState.INPUT_REQUIRED)
    follow = _send(wire, text="more", headers=_auth(key), taskId=first["id"])["result"]["task"]
    assert follow["id"] == first["id"]
    assert follow["contextId"] == first["contextId"]
    assert [m["parts"][0]["text"] for m in follow["history"]] == ["hi", "more"]


def test_new_task_in_existing_context(wire, agent, key):
    first = _send(wire, headers=_auth(key))["result"]["task"]
    second = _send(wire, headers=_auth(key), contextId=first["contextId"])["result"]["task"]
    assert second["id"] != first["id"]
    assert second["contextId"] == first["contextId"]


def test_get_task_history_length(wire, agent, key):
    task_id = _send(wire, headers=_auth(key))["result"]["task"]["id"]
    for i in range(3):
        services.task_append_message(
            task_id=task_id, message={**user_message(f"m{i}"), "role": "ROLE_AGENT"}
        )
    full = wire.rpc("GetTask", {"id": task_id}, headers=_auth(key))["result"]
    assert len(full["history"]) == 4
    none = wire.rpc("GetTask", {"id": task_id, "historyLength": 0}, headers=_auth(key))["result"]
    assert "history" not in none
    two = wire.rpc("GetTask", {"id": task_id, "historyLength": 2}, headers=_auth(key))["result"]
    assert [m["parts"][0]["text"] for m in two["history"]] == ["m1", "m2"]
    rest = wire.request("GET", f"/tasks/{task_id}?historyLength=1", headers=_auth(key))
    assert rest.headers["content-type"].startswith("application/a2a+json")
    assert [m["parts"][0]["text"] for m in rest.json()["history"]] == ["m2"]


def test_get_tasks_made_at_once_are_read_together_each_answered_as_asked(
    wire, agent, key, monkeypatch
):
    # Concurrent GetTasks of different callers, tasks and history lengths, with a foreign, an
    # unknown and a malformed id among them: one statement reads them (each one's keys), and
    # each caller gets its own answer, as alone.
    from tasks import selectors

    mine = _send(wire, headers=_auth(key), text="mine")["result"]["task"]["id"]
    anons = _send(wire, text="anon")["result"]["task"]["id"]
    services.task_append_message(task_id=mine, message={**user_message("m"), "role": "ROLE_AGENT"})
    unknown = "00000000-0000-0000-0000-000000000000"

    def get(task_id, headers=None, **extra):
        body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id, **extra}}
        return ("POST", "/", {"json": body, "headers": headers or {}})

    asked = [
        get(mine, _auth(key)),
        get(mine, _auth(key), historyLength=1),
        get(anons),
        get(mine),  # foreign: the anonymous caller does not own it
        get(anons, _auth(key)),  # foreign the other way
        get(unknown, _auth(key)),
        get("not-a-uuid"),
        get(mine, _auth(key), historyLength=0),
    ]
    alone = [wire.request(*one[:2], **one[2]).json() for one in asked]
    reads = spy(monkeypatch, selectors, "task_snapshots_for_owner")
    together = [r.json() for r in wire.concurrently(asked)]
    assert together == alone
    texts = [[m["parts"][0]["text"] for m in a["result"].get("history", [])] for a in alone[:3]]
    assert texts == [["mine", "m"], ["m"], ["anon"]]
    assert [a["error"]["code"] for a in alone[3:7]] == [-32001] * 4
    assert "history" not in alone[7]["result"]
    # Every well-formed id was read, in fewer statements than requests (one per turn of the
    # event loop; the requests reach the read in the same turn or a few).
    keys = [k for call in reads for k in call.kwargs["keys"]]
    assert len(keys) == 7
    assert len(reads) < 7


def test_new_tasks_sent_at_once_are_written_together_each_answered_as_asked(
    wire, agent, key, monkeypatch
):
    # Concurrent sends that open tasks: authenticated and anonymous, two identical retries
    # racing, a messageId reused with another request. Fewer writes than sends (one per turn
    # of the event loop), and each caller gets what it would get alone.
    taken = _send(wire, headers=_auth(key), text="first", messageId="taken")["result"]["task"]
    writes = spy(monkeypatch, services, "task_send_new")

    def send(text, headers=None, **message):
        params = {
            "message": {**user_message(text), **message},
            "configuration": {"returnImmediately": True},
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
        return ("POST", "/", {"json": body, "headers": headers or {}})

    answers = [
        r.json()
        for r in wire.concurrently(
            [
                send("a", _auth(key), messageId="a"),
                send("b", _auth(key), messageId="b"),
                send("anon"),
                send("twice", _auth(key), messageId="twice"),
                send("twice", _auth(key), messageId="twice"),
                send("other text", _auth(key), messageId="taken"),
                send("c", _auth(key), messageId="c"),
            ]
        )
    ]
    tasks = [a.get("result", {}).get("task") for a in answers]
    assert [t["history"][0]["parts"][0]["text"] for t in tasks[:5] + tasks[6:]] == [
        "a", "b", "anon", "twice", "twice", "c",
    ]  # fmt: skip
    assert all(t["status"]["state"] == "TASK_STATE_SUBMITTED" for t in tasks[:5] + tasks[6:])
    # The racing retries are one task; the reused messageId is refused and wrote nothing.
    assert tasks[3]["id"] == tasks[4]["id"]
    assert answers[5]["error"]["code"] == -32602
    assert "different request" in answers[5]["error"]["message"]
    ids = {t["id"] for t in tasks[:5] + tasks[6:]} | {taken["id"]}
    assert {str(pk) for pk in Task.objects.values_list("pk", flat=True)} == ids
    assert Task.objects.get(pk=taken["id"]).messages.get().parts == [{"text": "first"}]
    # Every send went through the batch write, in fewer calls than sends.
    assert sum(len(call.kwargs["sends"]) for call in writes) == 7
    assert len(writes) < 7


def test_list_tasks_newest_first_paginated_and_scoped(wire, agent, key):
    other = api_key_create(agent=agent, name="other")
    ids = [_send(wire, headers=_auth(key))["result"]["task"]["id"] for _ in range(5)]
    _send(wire, headers=_auth(other))  # another principal's task is never listed
    seen, token = [], None
    while True:
        params = {"pageSize": 2, **({"pageToken": token} if token else {})}
        page = wire.rpc("ListTasks", params, headers=_auth(key))["result"]
        assert page["totalSize"] == 5
        assert page["pageSize"] == 2
        seen += [t["id"] for t in page["tasks"]]
        # New tasks created mid-listing are newer than the cursor: pages stay stable.
        _send(wire, headers=_auth(other))
        token = page["nextPageToken"]
        if not token:
            break
    assert seen == list(reversed(ids))
    assert all("artifacts" not in t for t in page["tasks"])


def test_list_tasks_filters(wire, agent, key):
    a = _send(wire, headers=_auth(key), contextId="ctx-a")["result"]["task"]["id"]
    _send(wire, headers=_auth(key), contextId="ctx-b")
    services.task_transition(task_id=a, to_state=TaskState.WORKING)
    services.task_add_artifact(task_id=a, artifact={"artifactId": "r", "parts": [{"text": "r"}]})
    by_ctx = wire.rpc("ListTasks", {"contextId": "ctx-a"}, headers=_auth(key))["result"]
    assert [t["id"] for t in by_ctx["tasks"]] == [a]
    by_state = wire.rpc("ListTasks", {"status": "TASK_STATE_WORKING"}, headers=_auth(key))
    assert [t["id"] for t in by_state["result"]["tasks"]] == [a]
    with_artifacts = wire.rpc(
        "ListTasks", {"contextId": "ctx-a", "includeArtifacts": True}, headers=_auth(key)
    )["result"]
    assert with_artifacts["tasks"][0]["artifacts"][0]["artifactId"] == "r"
    ts = Task.objects.get(pk=a).status_timestamp.isoformat().replace("+00:00", "Z")
    after = wire.rpc("ListTasks", {"statusTimestampAfter": ts}, headers=_auth(key))["result"]
    assert [t["id"] for t in after["tasks"]] == [a]
    rest = wire.request(
        "GET", "/tasks?contextId=ctx-a&status=TASK_STATE_WORKING", headers=_auth(key)
    )
    assert [t["id"] for t in rest.json()["tasks"]] == [a]


def test_anonymous_list_requires_context(wire, agent):
    _send(wire, contextId="mine")
    error = wire.rpc("ListTasks", {})["error"]
    assert error["code"] == -32602
    listed = wire.rpc("ListTasks", {"contextId": "mine"})["result"]
    assert listed["totalSize"] == 1


def test_cancel_task(wire, agent):
    task_id = _send(wire)["result"]["task"]["id"]
    canceled = wire.rpc("CancelTask", {"id": task_id})["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    again = wire.request("POST", f"/tasks/{task_id}:cancel")
    assert again.status_code == 400


def test_tenancy_slug_path_root_and_tenant_param(wire, agent):
    AgentFactory(slug="second", executor="external")
    via_path = _send(wire, path="/second")["result"]["task"]["id"]
    assert Task.objects.get(pk=via_path).agent.slug == "second"
    params = {
        "tenant": "second",
        "message": user_message(),
        "configuration": {"returnImmediately": True},
    }
    via_param = wire.rpc("SendMessage", params)["result"]["task"]["id"]
    assert Task.objects.get(pk=via_param).agent.slug == "second"
    via_root = _send(wire)["result"]["task"]["id"]
    assert Task.objects.get(pk=via_root).agent.slug == "ops"
    rest = wire.request(
        "POST",
        "/second/message:send",
        json={"message": user_message(), "configuration": {"returnImmediately": True}},
    )
    assert Task.objects.get(pk=rest.json()["task"]["id"]).agent.slug == "second"
    # A task of one tenant is not found through another.
    assert wire.rpc("GetTask", {"id": via_path})["error"]["code"] == -32001


def test_card_interfaces_etag_and_304(wire, agent):
    resp = wire.request("GET", "/ops/.well-known/agent-card.json")
    card = resp.json()
    urls = {
        (i["protocolBinding"], i["protocolVersion"]): i["url"] for i in card["supportedInterfaces"]
    }
    assert urls[("JSONRPC", "1.0")] == "http://testserver/ops"
    assert urls[("HTTP+JSON", "1.0")] == "http://testserver/ops"
    assert urls[("JSONRPC", "0.3")] == "http://testserver/ops/v0.3"
    assert all("tenant" not in i for i in card["supportedInterfaces"])
    assert card["capabilities"]["pushNotifications"] is True
    assert card["capabilities"]["extensions"][0]["params"]["jwksUrl"] == (
        "http://testserver/ops/.well-known/jwks.json"
    )
    assert card["capabilities"]["streaming"] is True  # this process's event hub is connected
    assert card["url"] == "http://testserver/ops/v0.3"  # v0.3 top-level fields merged
    etag = resp.headers["ETag"]
    assert "max-age=" in resp.headers["Cache-Control"]
    again = wire.request("GET", "/ops/.well-known/agent-card.json", headers={"If-None-Match": etag})
    assert again.status_code == 304
    root = wire.request("GET", "/.well-known/agent-card.json").json()
    assert root["supportedInterfaces"][0]["url"] == "http://testserver/"


def test_card_header_lines_are_those_of_a_plain_response(wire, agent):
    """The cached card's header lines, built once, are those Starlette's Response builds for
    its body and headers; an edit of the agent's max-age reaches them."""

    def expected(resp, max_age: int, status: int) -> list[tuple[bytes, bytes]]:
        headers = {"ETag": resp.headers["ETag"], "Cache-Control": f"public, max-age={max_age}"}
        if status == 304:
            return Response(status_code=304, headers=headers).raw_headers
        return Response(resp.content, media_type="application/json", headers=headers).raw_headers

    path = "/ops/.well-known/agent-card.json"
    first, cached = wire.request("GET", path), wire.request("GET", path)
    assert cached.content == first.content
    assert cached.headers.raw == expected(cached, agent.card_max_age, 200)
    etag = cached.headers["ETag"]
    again = wire.request("GET", path, headers={"If-None-Match": f'"other", {etag}'})
    assert (again.status_code, again.content) == (304, b"")
    assert again.headers.raw == expected(again, agent.card_max_age, 304)
    assert wire.request("GET", path, headers={"If-None-Match": '"other"'}).status_code == 200

    # A header added to one response reaches no later one.
    scope = {"type": "http", "method": "GET", "path": path, "headers": [(b"host", b"testserver")]}
    scope |= {"scheme": "http", "query_string": b"", "server": ("testserver", 80)}
    route = resolve("GET", path)

    async def two_cards():
        one = await discovery.card(Request(scope), route)
        one.headers["X-Extra"] = "1"
        return one, await discovery.card(Request(scope), route)

    one, two = asyncio.run(two_cards())
    assert (b"x-extra", b"1") in one.raw_headers
    assert two.raw_headers == one.raw_headers[:-1]  # the same card's lines, without it
    assert b"x-extra" not in dict(two.raw_headers)

    agent_update(agent_pk=agent.pk, changes={"card_max_age": 7}, actor="test")
    edited = wire.request("GET", path)
    assert edited.headers["Cache-Control"] == "public, max-age=7"
    assert edited.headers.raw == expected(edited, 7, 200)


def test_extended_card_needs_authentication(wire, transactional_db):
    secure = AgentFactory(slug="secure", auth_mode="api_key", executor="external")
    key = api_key_create(agent=secure, name="k")
    card = wire.request("GET", "/secure/.well-known/agent-card.json").json()
    assert card["capabilities"]["extendedAgentCard"] is True
    assert "bearer" in card["securitySchemes"]
    ext = wire.rpc("GetExtendedAgentCard", {}, path="/secure", headers=_auth(key))["result"]
    assert ext["name"] == secure.name
    assert wire.request("GET", "/secure/extendedAgentCard").status_code == 401
    public = AgentFactory(slug="pub", executor="external")
    error = wire.rpc("GetExtendedAgentCard", {}, path=f"/{public.slug}")["error"]
    assert error["code"] == -32004


def test_v03_json_rpc_without_header(wire, agent):
    params = {
        "message": {
            "kind": "message",
            "messageId": str(uuid.uuid4()),
            "role": "user",
            "parts": [{"kind": "text", "text": "legacy"}],
        },
        "configuration": {"blocking": False},
    }
    answer = wire.rpc("message/send", params)["result"]
    assert answer["kind"] == "task"
    assert answer["status"]["state"] == "submitted"
    got = wire.rpc("tasks/get", {"id": answer["id"]})["result"]
    assert got["history"][0]["parts"][0] == {"kind": "text", "text": "legacy"}
    error = wire.rpc("tasks/get", {"id": str(uuid.uuid4())})["error"]
    assert error["code"] == -32001
    assert isinstance(error["data"], dict)  # v0.3 error data is an object
    # v1.0 method names with the v0.3 header are unknown; v0.3 names with 1.0 too.
    resp = wire.request(
        "POST",
        "/",
        json={"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": params},
        headers={"A2A-Version": "1.0"},
    )
    assert resp.json()["error"]["code"] == -32601


def test_v03_rest_paths(wire, agent):
    """v0.3 REST speaks the v0.3 gRPC messages as JSON (what the SDK's v0.3 client sends)."""
    body = {
        "message": {
            "messageId": str(uuid.uuid4()),
            "role": "ROLE_USER",
            "content": [{"text": "legacy"}],
        },
        "configuration": {"blocking": False},
    }
    sent = wire.request("POST", "/ops/v0.3/v1/message:send", json=body)
    assert sent.status_code == 200, sent.text
    task = sent.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    got = wire.request("GET", f"/ops/v0.3/v1/tasks/{task['id']}").json()
    assert got["id"] == task["id"]
    assert got["history"][0]["content"] == [{"text": "legacy"}]
    canceled = wire.request("POST", f"/ops/v0.3/v1/tasks/{task['id']}:cancel", json={}).json()
    assert canceled["status"]["state"] == "TASK_STATE_CANCELLED"
