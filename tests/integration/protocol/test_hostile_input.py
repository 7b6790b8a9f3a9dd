"""Hostile input never yields a 500 and changes nothing (issue: protocol surface).

Each case asserts the specific error a client gets AND that the store is unchanged.
"""

from __future__ import annotations

import json
import uuid

import pytest

from agents.services import api_key_create
from tasks import services
from tasks.models import Message, Task, TaskEvent
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message


def _counts() -> tuple[int, int, int]:
    return Task.objects.count(), TaskEvent.objects.count(), Message.objects.count()


@pytest.fixture
def default_agent(transactional_db):
    return AgentFactory(slug="main", is_default=True, executor="external")


def _send_params(**message_overrides) -> dict:
    msg = user_message("hi")
    msg.update(message_overrides)
    return {"message": msg, "configuration": {"returnImmediately": True}}


def _rpc_error(answer: dict) -> dict:
    assert "error" in answer, answer
    return answer["error"]


def _reason(error: dict) -> str:
    return error["data"][0]["reason"]


@pytest.mark.parametrize(
    "raw",
    [
        b"{bad json",
        b"",
        b"   ",
        b"[1, 2",
        b'{"jsonrpc": "2.0", "id": 1, "method": NaN}',
        b"\xff\xfe",
    ],
)
def test_malformed_json_is_a_parse_error(wire, default_agent, raw):
    before = _counts()
    resp = wire.request("POST", "/", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 200
    body = resp.json()
    assert body["error"]["code"] == -32700
    assert body["id"] is None
    assert _counts() == before


def test_malformed_json_on_rest_is_400_with_status_body(wire, default_agent):
    resp = wire.request("POST", "/message:send", content=b"{nope")
    assert resp.status_code == 400
    assert resp.headers["content-type"].startswith("application/a2a+json")
    err = resp.json()["error"]
    assert err["status"] == "INVALID_ARGUMENT"
    assert err["details"][0]["reason"] == "PARSE_ERROR"


@pytest.mark.parametrize(
    ("envelope", "code"),
    [
        ({"id": 1, "method": "GetTask"}, -32600),  # no jsonrpc
        ({"jsonrpc": "1.0", "id": 1, "method": "GetTask"}, -32600),
        ({"jsonrpc": "2.0", "id": 1}, -32600),  # no method
        ({"jsonrpc": "2.0", "id": 1, "method": 42}, -32600),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "GetTask"}, -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": "NoSuchMethod"}, -32601),
        ({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": [1, 2]}, -32602),
        ({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": "x"}, -32602),
    ],
)
def test_invalid_jsonrpc_envelopes(wire, default_agent, envelope, code):
    resp = wire.request("POST", "/", json=envelope)
    assert resp.status_code == 200
    assert resp.json()["error"]["code"] == code


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"parts": []}, "message.parts"),
        ({"parts": [{}]}, "message.parts[0]"),
        ({"parts": [{"text": "a", "raw": "YQ=="}]}, "message"),  # two oneof members
        ({"parts": [{"raw": "%%%not-base64%%%"}]}, "message.parts[0].raw"),
        ({"messageId": ""}, "message.messageId"),
        ({"role": "ROLE_AGENT"}, "message.role"),
        ({"role": "ROLE_NOT_A_ROLE"}, "message.role"),
        ({"role": 7}, "message"),
        ({"parts": "text"}, "message"),
        ({"parts": [{"text": 5}]}, "message"),
        ({"messageId": "x" * 300}, "message.messageId"),
    ],
)
def test_invalid_messages_are_invalid_params_and_change_nothing(
    wire, default_agent, overrides, field
):
    before = _counts()
    error = _rpc_error(wire.rpc("SendMessage", _send_params(**overrides)))
    assert error["code"] == -32602, error
    violations = [d for d in error["data"] if "fieldViolations" in d]
    assert violations
    assert violations[0]["fieldViolations"][0]["field"].startswith(field)
    assert _counts() == before


def test_missing_message_is_invalid_params(wire, default_agent):
    error = _rpc_error(wire.rpc("SendMessage", {"configuration": {"returnImmediately": True}}))
    assert error["code"] == -32602


def test_nul_bytes_are_refused_before_the_store(wire, default_agent):
    before = _counts()
    for text in ["a\u0000b"]:
        error = _rpc_error(wire.rpc("SendMessage", _send_params(parts=[{"text": text}])))
        assert error["code"] == -32700
        assert "NUL" in error["message"]
    key_nul = {"message": {**user_message(), "metadata": {"k\u0000": 1}}}
    assert _rpc_error(wire.rpc("SendMessage", key_nul))["code"] == -32700
    assert _counts() == before


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"messageId": "\ud800"}, "message.messageId"),
        ({"parts": [{"text": "a\ud800"}]}, "message.parts"),
        ({"contextId": "\udfff"}, "message.contextId"),
        ({"metadata": {"\ud800": 1}}, "message.metadata"),
        ({"metadata": {"k": "\ud800"}}, "message.metadata"),
    ],
)
def test_unpaired_surrogates_are_refused_alone_in_a_batch_and_change_nothing(
    wire, default_agent, overrides, field
):
    # JSON may escape half a UTF-16 pair; no text column can keep it. Sent at once with a
    # good send (the sends of one turn are written together), it is refused alone.
    def post(params):
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
        raw = json.dumps(body).encode()  # the surrogate stays an ASCII escape on the wire
        return ("POST", "/", {"content": raw, "headers": {"content-type": "application/json"}})

    bad, good = wire.concurrently([post(_send_params(**overrides)), post(_send_params())])
    error = _rpc_error(bad.json())
    assert error["code"] == -32602, error
    violations = [d for d in error["data"] if "fieldViolations" in d]
    assert violations[0]["fieldViolations"][0]["field"].startswith(field)
    task = good.json()["result"]["task"]
    assert list(Task.objects.values_list("pk", flat=True)) == [uuid.UUID(task["id"])]
    assert Message.objects.count() == 1


def test_deep_nesting_is_refused(wire, default_agent):
    deep = '{"a":' * 5000 + '"x"' + "}" * 5000
    msg = json.dumps(user_message())[:-1] + ', "metadata": ' + deep + "}"
    raw = '{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": ' + msg + "}}"
    resp = wire.request("POST", "/", content=raw.encode())
    assert resp.status_code == 200
    assert resp.json()["error"]["code"] == -32700
    assert Task.objects.count() == 0


def test_body_over_limit_refused_from_content_length(wire, default_agent, settings):
    settings.A2A_MAX_BODY_BYTES = 1000
    big = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": _send_params(parts=[{"text": "x" * 5000}]),
        }
    )
    resp = wire.request("POST", "/", content=big.encode())
    assert resp.status_code == 413
    assert resp.json()["error"]["data"][0]["reason"] == "PAYLOAD_TOO_LARGE"
    rest = wire.request("POST", "/message:send", content=big.encode())
    assert rest.status_code == 413
    assert Task.objects.count() == 0


def test_unknown_and_foreign_task_ids_are_task_not_found(wire, default_agent):
    owner_key = api_key_create(agent=default_agent, name="owner")
    other_key = api_key_create(agent=default_agent, name="other")
    task = task_create(agent=default_agent, owner=owner_key.key.principal, message=user_message())
    for task_id in [str(uuid.uuid4()), "not-a-uuid", "'; DROP TABLE tasks_task; --", str(task.id)]:
        error = _rpc_error(
            wire.rpc(
                "GetTask", {"id": task_id}, headers={"Authorization": f"Bearer {other_key.token}"}
            )
        )
        assert error["code"] == -32001, task_id
        rest = wire.request(
            "GET", f"/tasks/{task_id}", headers={"Authorization": f"Bearer {other_key.token}"}
        )
        assert rest.status_code == 404
        assert rest.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
    # The owner sees it.
    mine = wire.rpc(
        "GetTask", {"id": str(task.id)}, headers={"Authorization": f"Bearer {owner_key.token}"}
    )
    assert mine["result"]["id"] == str(task.id)


def test_cancel_terminal_task_is_not_cancelable_and_changes_nothing(wire, default_agent):
    task = task_create(agent=default_agent, owner="anonymous", message=user_message())
    services.task_transition(task_id=task.id, to_state=TaskState.COMPLETED)
    before = _counts()
    error = _rpc_error(wire.rpc("CancelTask", {"id": str(task.id)}))
    assert error["code"] == -32002
    rest = wire.request("POST", f"/tasks/{task.id}:cancel", json={})
    assert rest.status_code == 400
    assert rest.json()["error"]["details"][0]["reason"] == "TASK_NOT_CANCELABLE"
    assert _counts() == before
    assert Task.objects.get(pk=task.id).state == TaskState.COMPLETED


def test_message_to_terminal_task_is_unsupported_operation(wire, default_agent):
    task = task_create(agent=default_agent, owner="anonymous", message=user_message())
    services.task_transition(task_id=task.id, to_state=TaskState.FAILED)
    before = _counts()
    error = _rpc_error(wire.rpc("SendMessage", _send_params(taskId=str(task.id))))
    assert error["code"] == -32004
    assert _counts() == before


def test_message_with_mismatched_context_is_invalid_params(wire, default_agent):
    task = task_create(agent=default_agent, owner="anonymous", message=user_message())
    before = _counts()
    error = _rpc_error(
        wire.rpc("SendMessage", _send_params(taskId=str(task.id), contextId="other"))
    )
    assert error["code"] == -32602
    assert _counts() == before


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"pageSize": 0}, "pageSize"),
        ({"pageSize": 101}, "pageSize"),
        ({"pageSize": "many"}, "pageSize"),
        ({"historyLength": -1}, "historyLength"),
        ({"status": "TASK_STATE_BOGUS"}, "status"),
        ({"unknownField": 1, "status": "TASK_STATE_WORKNG"}, "status"),  # not "no filter"
        ({"pageToken": "garbage!"}, "pageToken"),
        ({"statusTimestampAfter": "yesterday"}, "statusTimestampAfter"),
    ],
)
def test_list_tasks_invalid_filters(wire, default_agent, params, field):
    error = _rpc_error(wire.rpc("ListTasks", {"contextId": "c", **params}))
    assert error["code"] == -32602
    assert error["data"][1]["fieldViolations"][0]["field"] == field


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"id": 5}, "id"),
        ({"id": ["t"]}, "id"),
        ({"id": "\ud800"}, "id"),  # text no column can keep
        ({"id": "t", "historyLength": True}, "historyLength"),
        ({"id": "t", "historyLength": 2**31}, "historyLength"),
        ({"id": "t", "historyLength": "many"}, "historyLength"),
    ],
)
def test_get_task_params_of_the_wrong_type_are_invalid_params(wire, default_agent, params, field):
    # Flat requests are built without protobuf's JSON parser (tasks/wire.parse_dict); what
    # the direct build cannot take still reaches the client as the parser words it.
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": params}
    raw = json.dumps(body).encode()  # a surrogate stays an ASCII escape on the wire
    resp = wire.request("POST", "/", content=raw, headers={"content-type": "application/json"})
    error = _rpc_error(resp.json())
    assert error["code"] == -32602
    assert error["data"][1]["fieldViolations"][0]["field"] == field


@pytest.mark.parametrize(
    "status", ['"\\ud800"', "1e400"], ids=["lone-surrogate", "beyond-a-double"]
)
def test_list_tasks_status_protobuf_cannot_read_is_invalid_params(wire, default_agent, status):
    # Both once escaped protobuf's parser as errors no handler expected (a 500).
    raw = (
        '{"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"contextId": "c", '
        f'"status": {status}}}}}'
    ).encode()
    resp = wire.request("POST", "/", content=raw, headers={"content-type": "application/json"})
    error = _rpc_error(resp.json())
    assert error["code"] == -32602
    assert error["data"][1]["fieldViolations"][0]["field"] == "params"


def test_get_task_with_whole_number_params_reads_the_task(wire, default_agent):
    task = task_create(agent=default_agent, owner="anonymous", message=user_message())
    for history, seen in ((0, None), (1.0, 1), ("1", 1)):  # ProtoJSON takes all three
        answer = wire.rpc("GetTask", {"id": str(task.id), "historyLength": history})
        assert answer["result"]["id"] == str(task.id), answer
        assert len(answer["result"].get("history", [])) == (seen or 0)


def test_rest_query_types_are_checked(wire, default_agent):
    for query in ["pageSize=abc", "includeArtifacts=maybe", "historyLength=1.5"]:
        resp = wire.request("GET", f"/tasks?contextId=c&{query}")
        assert resp.status_code == 400, query
        assert resp.json()["error"]["details"][0]["reason"] == "INVALID_PARAMS"


def test_nul_in_a_rest_query_is_invalid_params_not_a_500(wire, default_agent):
    for query in ["contextId=a%00b", "a%00=1", "pageToken=%00"]:
        resp = wire.request("GET", f"/tasks?{query}")
        assert resp.status_code == 400, (query, resp.text)
        assert resp.json()["error"]["details"][0]["reason"] == "INVALID_PARAMS"
    assert wire.request("GET", "/tasks/a%00b").status_code == 404


def test_wrong_version_header(wire, default_agent):
    for version in ["2.0", "0.2", "banana"]:
        resp = wire.request(
            "POST",
            "/",
            json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}},
            headers={"A2A-Version": version},
        )
        assert resp.json()["error"]["code"] == -32009, version
        rest = wire.request("GET", "/tasks/x", headers={"A2A-Version": version})
        assert rest.status_code == 400
        assert rest.json()["error"]["details"][0]["reason"] == "VERSION_NOT_SUPPORTED"


def test_batches(wire, default_agent, settings):
    settings.A2A_JSONRPC_MAX_BATCH = 3
    ok = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": str(uuid.uuid4())}}
    notification = {"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "x"}}
    stream = {"jsonrpc": "2.0", "id": 2, "method": "SendStreamingMessage", "params": _send_params()}
    resp = wire.request("POST", "/", json=[ok, notification, stream])
    answers = resp.json()
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[0]["error"]["code"] == -32001
    assert answers[1]["error"]["code"] == -32600  # streaming refused inside a batch
    too_many = wire.request("POST", "/", json=[ok] * 4).json()
    assert too_many["error"]["code"] == -32600
    assert wire.request("POST", "/", json=[]).json()["error"]["code"] == -32600
    only_notifications = wire.request("POST", "/", json=[notification, notification])
    assert only_notifications.status_code == 204
    assert only_notifications.content == b""


def test_notification_gets_no_body_and_still_acts(wire, default_agent):
    resp = wire.request(
        "POST", "/", json={"jsonrpc": "2.0", "method": "SendMessage", "params": _send_params()}
    )
    assert resp.status_code == 204
    assert resp.content == b""
    assert Task.objects.count() == 1


def test_unauthenticated_and_bad_keys(wire, transactional_db):
    agent = AgentFactory(slug="secure", auth_mode="api_key", executor="external")
    resp = wire.request(
        "POST",
        "/secure",
        json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}},
    )
    assert resp.status_code == 401
    assert "WWW-Authenticate" in resp.headers
    assert resp.json()["error"]["data"][0]["reason"] == "UNAUTHENTICATED"
    other = AgentFactory(slug="other")
    foreign_key = api_key_create(agent=other, name="k")
    for token in ["garbage", "a2a_000000000000_nope", foreign_key.token]:
        rest = wire.request("GET", "/secure/tasks/x", headers={"Authorization": f"Bearer {token}"})
        assert rest.status_code == 401, token
    assert agent.tasks.count() == 0


def test_unknown_tenant_and_method_not_allowed(wire, default_agent):
    resp = wire.request("GET", "/no-such-agent/tasks/x")
    assert resp.status_code == 404
    assert resp.json()["error"]["details"][0]["reason"] == "AGENT_NOT_FOUND"
    resp = wire.request("DELETE", "/tasks/x")
    assert resp.status_code == 405


def test_streaming_switched_off_by_the_operator_is_unsupported(wire, default_agent):
    default_agent.streaming_enabled = False
    default_agent.save()
    before = _counts()
    assert _rpc_error(wire.rpc("SendStreamingMessage", _send_params()))["code"] == -32004
    assert _rpc_error(wire.rpc("SubscribeToTask", {"id": str(uuid.uuid4())}))["code"] == -32004
    assert _counts() == before


def test_push_switched_off_by_the_operator_is_not_supported(wire, default_agent):
    default_agent.push_notifications_enabled = False
    default_agent.save()
    cfg = {"taskId": str(uuid.uuid4()), "url": "https://example.org/hook"}
    assert _rpc_error(wire.rpc("CreateTaskPushNotificationConfig", cfg))["code"] == -32003
    inline = _send_params()
    inline["configuration"]["taskPushNotificationConfig"] = {"url": "https://example.org/hook"}
    before = _counts()
    assert _rpc_error(wire.rpc("SendMessage", inline))["code"] == -32003
    assert _counts() == before
    resp = wire.request("POST", f"/tasks/{uuid.uuid4()}/pushNotificationConfigs", json=cfg)
    assert resp.status_code == 400
    assert resp.json()["error"]["details"][0]["reason"] == "PUSH_NOTIFICATION_NOT_SUPPORTED"
    card = wire.request("GET", "/.well-known/agent-card.json").json()
    assert card["capabilities"]["pushNotifications"] is False


def test_required_extension_not_activated(wire, transactional_db):
    uri = "https://example.org/ext/needed/v1"
    AgentFactory(
        slug="ext",
        extensions=[{"uri": uri, "required": True, "description": "needed"}],
        executor="external",
    )
    error = _rpc_error(wire.rpc("SendMessage", _send_params(), path="/ext"))
    assert error["code"] == -32008
    resp = wire.request(
        "POST",
        "/ext",
        json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": _send_params()},
        headers={"A2A-Extensions": uri},
    )
    assert "result" in resp.json()
    assert resp.headers["A2A-Extensions"] == uri


def test_a_host_outside_allowed_hosts_is_refused(wire, default_agent, settings):
    """URLs the protocol answers with (the card's interfaces, a webhook JWT's issuer) are built
    from the Host: one outside ALLOWED_HOSTS is refused, as Django refuses it on its views."""
    settings.ALLOWED_HOSTS = ["agents.example.com"]
    evil = {"Host": "evil.example.net"}
    for method, path in [("GET", "/.well-known/agent-card.json"), ("GET", "/tasks")]:
        resp = wire.request(method, path, headers=evil)
        assert resp.status_code == 400, (path, resp.text)
        assert "ALLOWED_HOSTS" in resp.json()["error"]["message"]
    rpc = wire.request("POST", "/", headers=evil, json={"jsonrpc": "2.0", "id": 1})
    assert rpc.status_code == 400
    card = wire.request(
        "GET", "/.well-known/agent-card.json", headers={"Host": "agents.example.com:8443"}
    )
    assert card.status_code == 200
    assert card.json()["supportedInterfaces"][0]["url"].startswith("http://agents.example.com:8443")
    settings.A2A_PUBLIC_BASE_URL = "https://a2a.example.com"
    public = wire.request("GET", "/.well-known/agent-card.json", headers=evil)
    assert public.status_code == 200
    assert public.json()["supportedInterfaces"][0]["url"].startswith("https://a2a.example.com")
