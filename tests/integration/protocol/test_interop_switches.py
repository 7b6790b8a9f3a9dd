"""Policies that cost interoperability (issue 18): each default kept, each alternative a
setting. ListTasks by anonymous callers (Agent.anonymous_list_tasks), webhook hosts resolved
at registration or only at connect time (A2A_WEBHOOK_RESOLVE_AT_REGISTRATION), the task looked
up before the URL, and requests without an A2A-Version header (Agent.strict_version_header)."""

from __future__ import annotations

import pytest

from agents.models import AnonymousListing
from tests.factories import AgentFactory, user_message
from webhooks.models import PushConfig

V1 = {"A2A-Version": "1.0"}
UNRESOLVABLE = "https://hooks.unresolvable.invalid/a2a"  # .invalid never resolves (RFC 6761)


@pytest.fixture
def agent(db):
    return AgentFactory(slug="ops", is_default=True, executor="external")


def send(wire, text: str = "hi", headers=V1, path: str = "/") -> dict:
    params = {"message": user_message(text), "configuration": {"returnImmediately": True}}
    return wire.rpc("SendMessage", params, headers=headers, path=path)


def send_v03(wire) -> dict:
    message = {**user_message("v03"), "kind": "message", "role": "user"}
    message["parts"] = [{"kind": "text", "text": "v03"}]
    params = {"message": message, "configuration": {"blocking": False}}
    return wire.rpc("message/send", params)


def list_tasks(wire, **params) -> dict:
    return wire.rpc("ListTasks", params, headers=V1)


# --- ListTasks by anonymous callers --------------------------------------------------------


def test_anonymous_list_tasks_is_refused_by_default(wire, agent):
    send(wire)
    answer = list_tasks(wire, pageSize=1)
    assert answer["error"]["code"] == -32602
    assert "contextId" in answer["error"]["message"]


def test_anonymous_list_tasks_can_list_the_anonymous_tasks(wire, agent):
    agent.anonymous_list_tasks = AnonymousListing.ANONYMOUS_TASKS
    agent.save()
    ids = {send(wire, f"t{i}")["result"]["task"]["id"] for i in range(3)}
    page = list_tasks(wire, pageSize=2)["result"]
    assert (page["totalSize"], len(page["tasks"])) == (3, 2)
    assert page["nextPageToken"]
    rest = list_tasks(wire, pageSize=2, pageToken=page["nextPageToken"])["result"]
    assert {t["id"] for t in page["tasks"] + rest["tasks"]} == ids
    # Another agent's anonymous tasks are not this agent's.
    other = AgentFactory(slug="other", executor="external")
    send(wire, path=f"/{other.slug}/")
    assert list_tasks(wire, pageSize=100)["result"]["totalSize"] == 3


def test_anonymous_list_tasks_can_answer_an_empty_list(wire, agent):
    agent.anonymous_list_tasks = AnonymousListing.EMPTY
    agent.save()
    task = send(wire)["result"]["task"]
    assert list_tasks(wire, pageSize=1)["result"] == {
        "tasks": [],
        "nextPageToken": "",
        "pageSize": 1,
        "totalSize": 0,
    }
    # Naming a contextId still lists its tasks.
    named = list_tasks(wire, contextId=task["contextId"])["result"]
    assert [t["id"] for t in named["tasks"]] == [task["id"]]


# --- webhook host resolution; the task before the URL ---------------------------------------


def create_config(wire, task_id: str, url: str) -> dict:
    return wire.rpc(
        "CreateTaskPushNotificationConfig",
        {"taskId": task_id, "url": url, "token": "t0ken"},
        headers=V1,
    )


def test_a_host_that_does_not_resolve_is_refused_at_registration_by_default(wire, agent):
    task_id = send(wire)["result"]["task"]["id"]
    answer = create_config(wire, task_id, UNRESOLVABLE)
    assert answer["error"]["code"] == -32602
    assert "does not resolve" in answer["error"]["message"]
    assert not PushConfig.objects.exists()


def test_resolution_can_be_left_to_the_connect_time_check(wire, agent, settings):
    settings.A2A_WEBHOOK_RESOLVE_AT_REGISTRATION = False
    task_id = send(wire)["result"]["task"]["id"]
    answer = create_config(wire, task_id, UNRESOLVABLE)
    assert answer["result"]["url"] == UNRESOLVABLE, answer
    assert PushConfig.objects.filter(task_id=task_id).count() == 1
    # What needs no DNS is still refused at once: a private literal, a bad scheme.
    for url in ("https://10.1.2.3/hook", "ftp://hooks.example.org/"):
        refused = create_config(wire, task_id, url)
        assert refused["error"]["code"] == -32602, (url, refused)
    assert PushConfig.objects.filter(task_id=task_id).count() == 1


@pytest.mark.parametrize("url", [UNRESOLVABLE, "https://10.1.2.3/hook", "https://example.org/"])
def test_an_unknown_task_is_not_found_whatever_the_url(wire, agent, url):
    answer = create_config(wire, "00000000-0000-4000-8000-000000000000", url)
    assert answer["error"]["code"] == -32001, answer


def test_a_foreign_task_is_not_found_whatever_the_url(wire, agent):
    other = AgentFactory(slug="other", executor="external")
    foreign = send(wire, path=f"/{other.slug}/")["result"]["task"]["id"]
    answer = create_config(wire, foreign, "https://10.1.2.3/hook")
    assert answer["error"]["code"] == -32001, answer


def test_a_follow_up_with_an_inline_config_for_a_foreign_task_is_not_found(wire, agent):
    other = AgentFactory(slug="other", executor="external")
    foreign = send(wire, path=f"/{other.slug}/")["result"]["task"]
    message = user_message("x", taskId=foreign["id"])
    config = {"taskPushNotificationConfig": {"url": "https://10.1.2.3/hook", "token": "t0ken"}}
    answer = wire.rpc("SendMessage", {"message": message, "configuration": config}, headers=V1)
    assert answer["error"]["code"] == -32001, answer


# --- requests without A2A-Version -----------------------------------------------------------


def test_without_the_header_the_method_name_decides_by_default(wire, agent):
    assert send(wire, headers={})["result"]["task"]["id"]
    legacy = send_v03(wire)
    assert legacy["result"]["kind"] == "task", legacy


def test_the_strict_switch_reads_a_request_without_the_header_as_0_3(wire, agent):
    agent.strict_version_header = True
    agent.save()
    answer = send(wire, headers={})
    assert answer["error"]["code"] == -32601
    assert "A2A-Version 0.3" in answer["error"]["message"]
    # 0.3 method names are served; the 1.0 header still gets 1.0.
    legacy = send_v03(wire)
    assert legacy["result"]["kind"] == "task", legacy
    assert send(wire)["result"]["task"]["id"]
    # HTTP+JSON: the 1.0 routes do not serve 0.3.
    body = {"message": user_message("r"), "configuration": {"returnImmediately": True}}
    rest = wire.request("POST", "/message:send", json=body)
    assert rest.status_code == 400, rest.text
    assert rest.json()["error"]["details"][0]["reason"] == "VERSION_NOT_SUPPORTED"
    ok = wire.request("POST", "/message:send", json=body, headers=V1)
    assert ok.status_code == 200, ok.text
