"""What the official tooling (the A2A conformance suite, the SDK client) and a newcomer's
browser found answered wrongly (issue 18): an invalid JSON-RPC request without an id, the
v0.3 URL ignoring `A2A-Version: 1.0`, a wrong HTTP method labelled "not found", and a GET on
a JSON-RPC URL told its body is empty."""

from __future__ import annotations

import uuid

import pytest

from tests.factories import AgentFactory, user_message


@pytest.fixture
def agent(db):
    return AgentFactory(slug="ops", is_default=True, executor="external")


@pytest.mark.parametrize(
    "body",
    [
        {"jsonrpc": "aaa", "method": "SendMessage", "params": {}},  # the suite's case
        {"jsonrpc": "2.0", "params": {}},  # no method
        {"jsonrpc": "2.0", "method": 7},
    ],
)
def test_an_invalid_request_without_an_id_is_answered_with_id_null(wire, agent, body):
    """JSON-RPC 2.0 §4.1/§5: only a valid Request without an id is a notification."""
    resp = wire.request("POST", "/", json=body, headers={"A2A-Version": "1.0"})
    assert resp.status_code == 200
    answer = resp.json()
    assert answer["id"] is None
    assert answer["error"]["code"] == -32600


def test_a_valid_notification_still_gets_no_answer(wire, agent):
    body = {"jsonrpc": "2.0", "method": "NoSuchMethod", "params": {}}
    resp = wire.request("POST", "/", json=body, headers={"A2A-Version": "1.0"})
    assert (resp.status_code, resp.content) == (204, b"")


def test_the_v03_url_serves_1_0_when_the_header_asks_for_it(wire, agent):
    params = {"message": user_message("to the v0.3 URL"), "configuration": {}}
    params["configuration"]["returnImmediately"] = True
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}

    as_v1 = wire.request("POST", "/ops/v0.3", json=body, headers={"A2A-Version": "1.0"}).json()
    assert as_v1["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"

    # Without the header the URL speaks 0.3, whose method names differ.
    as_v03 = wire.request("POST", "/ops/v0.3", json=body).json()
    assert as_v03["error"]["code"] == -32601


def test_a_wrong_http_method_is_405_with_allow_not_a_404_body(wire, agent):
    resp = wire.request("DELETE", f"/ops/tasks/{uuid.uuid4()}", headers={"A2A-Version": "1.0"})
    assert resp.status_code == 405
    assert resp.headers["Allow"] == "GET"
    error = resp.json()["error"]
    assert (error["code"], error["status"]) == (405, "UNIMPLEMENTED")
    assert "DELETE is not allowed here; this URL takes GET" in error["message"]


def test_a_get_on_a_json_rpc_url_says_what_the_url_is_for(wire, agent):
    resp = wire.request("GET", "/ops")
    assert resp.status_code == 405
    assert resp.headers["Allow"] == "POST"
    message = resp.json()["error"]["message"]
    assert "JSON-RPC 2.0 endpoint: POST a request" in message
    assert "/ops/.well-known/agent-card.json" in message
    assert "empty" not in message


def test_a_get_on_the_root_is_the_landing_page_not_json_rpc(wire, agent):
    resp = wire.request("GET", "/")
    assert resp.status_code == 200
    assert "text/html" in resp.headers["content-type"]
    assert 'href="/ops/.well-known/agent-card.json"' in resp.text


@pytest.mark.parametrize(
    ("message", "field", "says"),
    [
        # The v0.3 habit: the enum's 1.0 names are listed.
        (
            {"role": "user"},
            "message.role",
            "'user' is not a Role: use one of ROLE_USER, ROLE_AGENT",
        ),
        ({"messageId": 123}, "message.messageId", "must be a string, not a number"),
        ({"parts": [{"text": 5}]}, "message.parts.text", "must be a string, not a number"),
        ({"parts": "hello"}, "message.parts", "must be an array"),
    ],
)
def test_a_wire_format_error_names_the_field_and_what_to_send(wire, agent, message, field, says):
    params = {"message": {**user_message("hi"), **message}}
    error = wire.rpc("SendMessage", params, headers={"A2A-Version": "1.0"})["error"]
    assert error["code"] == -32602
    [violation] = next(d for d in error["data"] if "fieldViolations" in d)["fieldViolations"]
    assert violation == {"field": field, "description": says}
    for internal in ("lf.a2a.v1", "bytes-like", "Failed to parse", "'int'"):
        assert internal not in error["message"] + violation["description"]


@pytest.mark.parametrize("message", [5, "hello", [], True])
def test_a_message_that_is_not_an_object_is_named_and_nothing_is_created(wire, agent, message):
    from tasks.models import Task

    params = {"message": message, "configuration": {"returnImmediately": True}}
    error = wire.rpc("SendMessage", params, headers={"A2A-Version": "1.0"})["error"]
    assert error["code"] == -32602
    [violation] = next(d for d in error["data"] if "fieldViolations" in d)["fieldViolations"]
    assert violation == {"field": "message", "description": "must be a JSON object"}
    assert not Task.objects.exists()


def test_a_message_over_the_part_limit_is_refused_and_nothing_is_created(wire, agent, settings):
    from tasks.models import Task

    settings.A2A_MAX_PARTS_PER_MESSAGE = 3
    at_limit = user_message("x", parts=[{"text": str(i)} for i in range(3)])
    over = user_message("x", parts=[{"text": str(i)} for i in range(4)])
    params = {"configuration": {"returnImmediately": True}}

    ok = wire.rpc("SendMessage", {"message": at_limit, **params}, headers={"A2A-Version": "1.0"})
    assert "result" in ok, ok
    refused = wire.rpc("SendMessage", {"message": over, **params}, headers={"A2A-Version": "1.0"})

    assert refused["error"]["code"] == -32602
    [violation] = next(d for d in refused["error"]["data"] if "fieldViolations" in d)[
        "fieldViolations"
    ]
    assert violation["field"] == "message.parts"
    assert "at most 3 parts" in violation["description"]
    assert Task.objects.count() == 1  # only the message at the limit opened a task


def test_the_demo_agent_echoes_any_media_type(wire, transactional_db):
    """seed_demo's agent declares */* both ways, so a file or data part is echoed, not -32005,
    and a client accepting only JSON output is served."""
    from io import StringIO

    from django.core.management import call_command

    call_command("seed_demo", stdout=StringIO())
    card = wire.request("GET", "/demo/.well-known/agent-card.json").json()
    assert card["defaultInputModes"] == card["defaultOutputModes"] == ["*/*"]
    message = user_message("x", parts=[{"raw": "iVBORw0KGgo=", "mediaType": "image/png"}])
    params = {
        "message": message,
        "configuration": {"returnImmediately": True, "acceptedOutputModes": ["application/json"]},
    }
    answer = wire.rpc("SendMessage", params, path="/demo", headers={"A2A-Version": "1.0"})
    assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED", answer
