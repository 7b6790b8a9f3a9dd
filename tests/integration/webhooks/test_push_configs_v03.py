"""v0.3 push-config methods (`tasks/pushNotificationConfig/set|get|list|delete`) on the
protocol app, in process: v0.3 shapes in, the v1.0 operations run, v0.3 shapes out.

JSON-RPC requests carry no A2A-Version header (absent = 0.3). The last tests drive the
official SDK's v0.3 compat transports (JSON-RPC and HTTP+JSON) against the same app.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
from a2a.compat.v0_3.rest_transport import CompatRestTransport
from a2a.types import a2a_pb2

from a2a_platform.asgi import application
from a2a_platform.lib.crypto import decrypt
from agents.services import api_key_create
from webhooks.models import Delivery, Endpoint, PushBinding, PushConfig

pytestmark = pytest.mark.usefixtures("public_dns")

HOOK = "https://hooks.example.org/a2a"
SECRET = "v03-cred-never-echoed"


def _auth(key) -> dict:
    return {"Authorization": f"Bearer {key.token}"}


def _legacy_message(text: str = "hi") -> dict:
    return {
        "kind": "message",
        "messageId": str(uuid.uuid4()),
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
    }


def _new_task(wire, key, **configuration) -> str:
    params = {"message": _legacy_message(), "configuration": {"blocking": False, **configuration}}
    answer = wire.rpc("message/send", params, headers=_auth(key))
    assert answer["result"]["kind"] == "task", answer
    return answer["result"]["id"]


def _set(wire, key, task_id: str, **config) -> dict:
    params = {"taskId": task_id, "pushNotificationConfig": {"url": HOOK, **config}}
    return wire.rpc("tasks/pushNotificationConfig/set", params, headers=_auth(key))


def _counts() -> tuple[int, int, int, int]:
    return (
        PushConfig.objects.count(),
        PushBinding.objects.count(),
        Delivery.objects.count(),
        Endpoint.objects.count(),
    )


# --- set / get / list / delete over JSON-RPC -------------------------------------------------


def test_set_answers_the_v03_shape_without_credentials(wire, agent, key):
    task_id = _new_task(wire, key)
    answer = _set(
        wire,
        key,
        task_id,
        id="cfg-1",
        token="tok",
        authentication={"schemes": ["Bearer"], "credentials": SECRET},
    )
    assert answer["result"] == {
        "taskId": task_id,
        "pushNotificationConfig": {
            "id": "cfg-1",
            "url": HOOK,
            "token": "tok",
            "authentication": {"schemes": ["Bearer"]},
        },
    }
    binding = PushBinding.objects.get()
    assert (binding.config.config_id, binding.auth_scheme) == ("cfg-1", "Bearer")
    assert decrypt(binding.credentials_encrypted) == SECRET
    assert SECRET not in binding.credentials_encrypted
    snapshot = Delivery.objects.get()
    assert (snapshot.kind, snapshot.seq) == ("snapshot", 1)


def test_set_without_id_gets_a_server_id(wire, agent, key):
    task_id = _new_task(wire, key)
    config = _set(wire, key, task_id)["result"]["pushNotificationConfig"]
    assert uuid.UUID(config["id"])
    assert config == {"id": config["id"], "url": HOOK}
    assert PushConfig.objects.get().config_id == config["id"]


def test_get_list_and_delete(wire, agent, key):
    task_id = _new_task(wire, key)
    first = _set(wire, key, task_id, id="a", authentication={"schemes": ["Basic"]})["result"]
    second = _set(wire, key, task_id, id="b", url="https://b.example.org/hook")["result"]

    got = wire.rpc(
        "tasks/pushNotificationConfig/get",
        {"id": task_id, "pushNotificationConfigId": "b"},
        headers=_auth(key),
    )["result"]
    assert got == second
    # pushNotificationConfigId is optional in v0.3: the task's first config answers.
    default = wire.rpc("tasks/pushNotificationConfig/get", {"id": task_id}, headers=_auth(key))
    assert default["result"] == first
    listed = wire.rpc("tasks/pushNotificationConfig/list", {"id": task_id}, headers=_auth(key))
    assert listed["result"] == [first, second]  # v0.3 answers a bare array

    for _ in range(2):  # idempotent
        deleted = wire.rpc(
            "tasks/pushNotificationConfig/delete",
            {"id": task_id, "pushNotificationConfigId": "a"},
            headers=_auth(key),
        )
        assert "error" not in deleted
        assert deleted["result"] is None
    assert PushConfig.objects.get(config_id="a").deleted_at is not None
    listed = wire.rpc("tasks/pushNotificationConfig/list", {"id": task_id}, headers=_auth(key))
    assert listed["result"] == [second]
    gone = wire.rpc(
        "tasks/pushNotificationConfig/get",
        {"id": task_id, "pushNotificationConfigId": "a"},
        headers=_auth(key),
    )["error"]
    assert gone["code"] == -32001
    assert isinstance(gone["data"], dict)  # v0.3 error data is an object


def test_get_of_a_task_without_configs_is_task_not_found(wire, agent, key):
    task_id = _new_task(wire, key)
    for params in ({"id": task_id}, {"id": task_id, "pushNotificationConfigId": "x"}):
        error = wire.rpc("tasks/pushNotificationConfig/get", params, headers=_auth(key))["error"]
        assert error["code"] == -32001
    listed = wire.rpc("tasks/pushNotificationConfig/list", {"id": task_id}, headers=_auth(key))
    assert listed["result"] == []


def test_set_with_an_existing_id_rebinds(wire, agent, key):
    task_id = _new_task(wire, key)
    _set(wire, key, task_id, id="cfg")
    again = _set(wire, key, task_id, id="cfg", url="https://new.example.org/x")["result"]
    assert again["pushNotificationConfig"] == {"id": "cfg", "url": "https://new.example.org/x"}
    push = PushConfig.objects.get()
    assert push.current_version == 2
    assert list(push.bindings.order_by("version").values_list("version", "url")) == [
        (1, HOOK),
        (2, "https://new.example.org/x"),
    ]


def test_refusals_are_v03_errors_and_write_nothing(wire, agent, key, settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = []
    task_id = _new_task(wire, key)
    for url in ("http://127.0.0.1/hook", "http://169.254.169.254/", "ftp://hooks.example.org/"):
        error = _set(wire, key, task_id, url=url)["error"]
        assert error["code"] == -32602
        assert error["data"]["fieldViolations"][0]["field"] == "url"
    missing_url = wire.rpc(
        "tasks/pushNotificationConfig/set",
        {"taskId": task_id, "pushNotificationConfig": {"id": "x"}},
        headers=_auth(key),
    )["error"]
    assert missing_url["code"] == -32602
    assert "url" in missing_url["data"]["fieldViolations"][0]["field"]
    missing_task = wire.rpc(
        "tasks/pushNotificationConfig/set",
        {"pushNotificationConfig": {"url": HOOK}},
        headers=_auth(key),
    )["error"]
    assert missing_task["code"] == -32602
    assert "taskId" in missing_task["data"]["fieldViolations"][0]["field"]
    missing_ids = wire.rpc(
        "tasks/pushNotificationConfig/delete", {"id": task_id}, headers=_auth(key)
    )["error"]
    assert missing_ids["code"] == -32602
    assert missing_ids["data"]["fieldViolations"][0]["field"] == "pushNotificationConfigId"
    no_task = wire.rpc(
        "tasks/pushNotificationConfig/get", {"pushNotificationConfigId": "x"}, headers=_auth(key)
    )["error"]
    assert no_task["code"] == -32602
    assert no_task["data"]["fieldViolations"][0]["field"] == "id"  # not "TaskIdParams.id"
    assert _counts() == (0, 0, 0, 0)


def test_another_principals_task_is_not_found(wire, agent, key):
    task_id = _new_task(wire, key)
    _set(wire, key, task_id, id="mine")
    other = api_key_create(agent=agent, name="other")
    before = _counts()
    calls = [
        (
            "tasks/pushNotificationConfig/set",
            {"taskId": task_id, "pushNotificationConfig": {"url": HOOK}},
        ),
        ("tasks/pushNotificationConfig/get", {"id": task_id, "pushNotificationConfigId": "mine"}),
        ("tasks/pushNotificationConfig/get", {"id": task_id}),
        ("tasks/pushNotificationConfig/list", {"id": task_id}),
        (
            "tasks/pushNotificationConfig/delete",
            {"id": task_id, "pushNotificationConfigId": "mine"},
        ),
    ]
    for method, params in calls:
        error = wire.rpc(method, params, headers=_auth(other))["error"]
        assert error["code"] == -32001, (method, error)
    assert _counts() == before
    assert PushConfig.objects.get().deleted_at is None


def test_inline_config_in_message_send(wire, agent, key):
    task_id = _new_task(
        wire, key, pushNotificationConfig={"url": HOOK, "token": "t", "id": "inline"}
    )
    push = PushConfig.objects.get()
    assert (str(push.task_id), push.config_id) == (task_id, "inline")
    assert decrypt(push.bindings.get().token_encrypted) == "t"
    snapshot = Delivery.objects.get()
    assert (snapshot.kind, snapshot.seq) == ("snapshot", 1)
    got = wire.rpc("tasks/pushNotificationConfig/get", {"id": task_id}, headers=_auth(key))
    assert got["result"]["pushNotificationConfig"] == {"id": "inline", "url": HOOK, "token": "t"}


def test_push_methods_need_the_capability(wire, agent, key):
    task_id = _new_task(wire, key)
    agent.push_notifications_enabled = False
    agent.save()
    error = _set(wire, key, task_id)["error"]
    assert error["code"] == -32003
    listed = wire.rpc("tasks/pushNotificationConfig/list", {"id": task_id}, headers=_auth(key))
    assert listed["error"]["code"] == -32003


# --- HTTP+JSON v0.3 (the v0.3 gRPC messages as JSON) ---------------------------------------


def test_rest_v03_push_configs(wire, agent, key):
    task_id = _new_task(wire, key)
    base = f"/{agent.slug}/v0.3/v1/tasks/{task_id}/pushNotificationConfigs"
    body = {  # what the SDK's v0.3 REST client sends
        "parent": f"tasks/{task_id}",
        "config_id": "r1",
        "config": {
            "name": f"tasks/{task_id}/pushNotificationConfigs/r1",
            "push_notification_config": {
                "url": HOOK,
                "token": "tok",
                "authentication": {"schemes": ["Bearer"], "credentials": SECRET},
            },
        },
    }
    created = wire.request("POST", base, json=body, headers=_auth(key))
    assert created.status_code == 200, created.text
    expected = {
        "name": f"tasks/{task_id}/pushNotificationConfigs/r1",
        "pushNotificationConfig": {
            "id": "r1",
            "url": HOOK,
            "token": "tok",
            "authentication": {"schemes": ["Bearer"]},
        },
    }
    assert created.json() == expected
    got = wire.request("GET", f"{base}/r1", headers=_auth(key))
    assert got.json() == expected
    listed = wire.request("GET", base, headers=_auth(key))
    assert listed.json() == {"configs": [expected]}
    assert SECRET not in created.text + got.text + listed.text
    for _ in range(2):
        deleted = wire.request("DELETE", f"{base}/r1", headers=_auth(key))
        assert deleted.status_code == 200
    missing = wire.request("GET", f"{base}/r1", headers=_auth(key))
    assert missing.status_code == 404
    refused = wire.request(
        "POST",
        base,
        json={
            "parent": f"tasks/{task_id}",
            "config": {"pushNotificationConfig": {"url": "http://10.0.0.1/"}},
        },
        headers=_auth(key),
    )
    assert refused.status_code == 400
    assert refused.json()["data"]["fieldViolations"][0]["field"] == "url"


# --- The SDK's v0.3 compat transports against the app ---------------------------------------


def _with_sdk(transport_cls, key, fn):
    async def go():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application),
            base_url="http://testserver",
            headers=_auth(key),
        ) as http:
            return await fn(transport_cls(http, None, "http://testserver/v0.3"))

    return asyncio.run(go())


@pytest.mark.parametrize("transport_cls", [CompatJsonRpcTransport, CompatRestTransport])
def test_sdk_v03_client_round_trip(wire, agent, key, transport_cls):
    task_id = _new_task(wire, key)

    async def create_and_get(client):
        config = a2a_pb2.TaskPushNotificationConfig(task_id=task_id, id="sdk", url=HOOK, token="t")
        config.authentication.scheme = "Bearer"
        config.authentication.credentials = SECRET
        created = await client.create_task_push_notification_config(config)
        got = await client.get_task_push_notification_config(
            a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task_id, id="sdk")
        )
        return created, got

    created, got = _with_sdk(transport_cls, key, create_and_get)
    for config in (created, got):
        assert (config.task_id, config.id, config.url, config.token) == (task_id, "sdk", HOOK, "t")
        assert config.authentication.scheme == "Bearer"
        assert config.authentication.credentials == ""  # never returned
    assert decrypt(PushBinding.objects.get().credentials_encrypted) == SECRET

    if transport_cls is CompatJsonRpcTransport:  # the SDK's v0.3 REST client has no list/delete

        async def list_and_delete(client):
            listed = await client.list_task_push_notification_configs(
                a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            await client.delete_task_push_notification_config(
                a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="sdk")
            )
            return listed

        listed = _with_sdk(transport_cls, key, list_and_delete)
        assert [c.id for c in listed.configs] == ["sdk"]
        assert PushConfig.objects.get().deleted_at is not None
