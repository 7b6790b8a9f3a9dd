"""`/api/v1/tasks/<taskId>/push-configs` over HTTP against a live web process: a task's push
configs registered through the services, re-registered (a new binding version) and deleted,
listed with every version; credentials are masked (never the secret); the view permission
decides; hostile ids are a 400, unknown ones a 404."""

from __future__ import annotations

import pytest

from tests.api_tokens import user_with
from tests.factories import AgentFactory, task_create, user_message
from webhooks.services import push_config_create, push_config_delete

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("public_dns")]

URL = "https://client.example.org/hooks/"
SECRETS = ("tok-1618033988", "cred-1414213562")


@pytest.fixture
def task(api_web):
    # cutover: a re-registration replaces the version at once (no drain to wait for).
    agent = AgentFactory(slug="hooks", executor="external", push_rebind_policy="cutover")
    task = task_create(agent=agent, owner="anonymous", message=user_message("hi"))
    push_config_create(task=task, config={"id": "a", "url": f"{URL}a1", "token": SECRETS[0]})
    push_config_create(
        task=task,
        config={
            "id": "a",
            "url": f"{URL}a2",
            "authentication": {"scheme": "Bearer", "credentials": SECRETS[1]},
        },
    )
    push_config_create(task=task, config={"id": "b.old~1", "url": f"{URL}b"})
    push_config_delete(task=task, config_id="b.old~1")
    return task


def test_a_tasks_configs_list_with_every_version_and_masked_credentials(task, tokens):
    answer = tokens.client("read").get(f"/api/v1/tasks/{task.pk}/push-configs")
    assert answer.status_code == 200, answer.text
    for secret in SECRETS:
        assert secret not in answer.text
    configs = {c["id"]: c for c in answer.json()["results"]}
    assert sorted(configs) == ["a", "b.old~1"]
    a = configs["a"]
    assert (a["taskId"], a["currentVersion"], a["deleted"]) == (str(task.pk), 2, False)
    v1, v2 = a["versions"]
    assert (v1["channel"], v1["status"], v1["url"]) == ("a.v1", "retired", f"{URL}a1")
    assert v1["token"] == "set"
    assert v1["authentication"] is None
    assert (v2["channel"], v2["status"], v2["url"]) == ("a.v2", "active", f"{URL}a2")
    assert v2["token"] is None
    assert v2["authentication"] == {"scheme": "Bearer", "credentials": "set"}
    assert v2["endpoint"] == "https://client.example.org:443"
    assert v1["retiredAt"] is not None
    assert v2["retiredAt"] is None
    b = configs["b.old~1"]
    assert (b["deleted"], [v["status"] for v in b["versions"]]) == (True, ["retired"])
    assert b["deletedAt"] is not None


def test_one_config_reads_by_its_id(task, tokens):
    api = tokens.client("read")
    answer = api.get(f"/api/v1/tasks/{task.pk}/push-configs/b.old~1")
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "b.old~1"
    assert [v["version"] for v in answer.json()["versions"]] == [1]
    listed = api.get(f"/api/v1/tasks/{task.pk}/push-configs").json()["results"]
    assert api.get(f"/api/v1/tasks/{task.pk}/push-configs/a").json() == listed[0]


def test_another_tasks_config_is_not_found(task, tokens):
    other = task_create(agent=task.agent, owner="anonymous", message=user_message("x"))
    answer = tokens.client("read").get(f"/api/v1/tasks/{other.pk}/push-configs/a")
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "not_found"
    empty = tokens.client("read").get(f"/api/v1/tasks/{other.pk}/push-configs")
    assert empty.json()["results"] == []


def test_reading_configs_needs_the_push_config_view_permission(task, tokens, http):
    assert http.get(f"/api/v1/tasks/{task.pk}/push-configs").status_code == 401
    tasks_only = user_with("tasks-only", "tasks.view_task")
    answer = tokens.client("read", name="tasks-only", user=tasks_only).get(
        f"/api/v1/tasks/{task.pk}/push-configs"
    )
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "permission_denied"
    for scope in ("read", "operate", "rebind"):
        assert tokens.client(scope).get(f"/api/v1/tasks/{task.pk}/push-configs").status_code == 200


@pytest.mark.parametrize(
    ("tail", "status", "field"),
    [
        ("push-configs/%2E%2E", 400, "configId"),
        ("push-configs/a%00b", 400, "configId"),
        ("push-configs/" + "c" * 256, 400, "configId"),
        ("push-configs/a%20b", 400, "configId"),
        ("push-configs/nope", 404, None),
    ],
)
def test_hostile_or_unknown_config_ids(task, tokens, tail, status, field):
    answer = tokens.client("read").get(f"/api/v1/tasks/{task.pk}/{tail}")
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    if field:
        assert error["code"] == "invalid_request"
        assert field in error["fields"]
    else:
        assert error["code"] == "not_found"


@pytest.mark.parametrize(
    ("task_id", "status"),
    [("not-a-uuid", 400), ("%00", 400), ("00000000-0000-0000-0000-000000000000", 404)],
)
def test_hostile_or_unknown_task_ids(api_web, tokens, task_id, status):
    answer = tokens.client("read").get(f"/api/v1/tasks/{task_id}/push-configs")
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == ("not_found" if status == 404 else "invalid_request")


def test_configs_are_not_written_here(task, tokens):
    """Registration is the client's (the A2A protocol, behind the push gate); an operator
    changes a config through a rebind. No write method is routed."""
    api = tokens.client("rebind")
    for method, path in [
        ("POST", f"/api/v1/tasks/{task.pk}/push-configs"),
        ("DELETE", f"/api/v1/tasks/{task.pk}/push-configs/a"),
        ("PUT", f"/api/v1/tasks/{task.pk}/push-configs/a"),
    ]:
        answer = api.request(method, path, json={"url": f"{URL}evil"})
        assert answer.status_code == 405, (method, answer.text)
    assert task.push_configs.get(config_id="a").current_version == 2
