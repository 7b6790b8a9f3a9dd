"""`/api/v1/agents/` end to end over HTTP against a live web process: create, read, update
(capability switches, rebind policy) through agents.services, with the rules every interface
gets (reserved slug, a card that renders); API keys (secret once, revoke); signing keys
(public parts, rotate = a rebind). Scopes: a read token cannot write (403, nothing changed),
a revoked token is 401."""

from __future__ import annotations

import pytest

from a2a_platform.api.services import api_token_create, api_token_revoke
from agents.models import (
    Agent,
    ApiKey,
    OperatorAction,
    PushChannelPolicy,
    SigningKey,
    SigningKeyState,
)
from tests import live
from tests.api_tokens import bearer, token_for, user_with
from tests.factories import AgentFactory
from tests.integration.api.live_api import _live_api, live_api  # noqa: F401 (fixtures)
from tests.readiness_helpers import mark_workers_live
from webhooks.models import Rebind

AGENT_PERMS = ("view_agent", "add_agent", "change_agent", "view_apikey", "add_apikey")
KEY_PERMS = ("change_apikey", "view_signingkey", "run_rebind", "view_rebind")

NEW = {"slug": "made-by-api", "name": "Made by API", "description": "an agent"}


@pytest.fixture
def operator():
    return user_with("integrator", *AGENT_PERMS, *KEY_PERMS)


@pytest.fixture
def write(operator):
    return bearer(token_for(operator, "rebind"))


@pytest.fixture
def read(operator):
    return bearer(token_for(operator, "read"))


def test_create_read_update_an_agent_and_its_card_follows(live_api, write):
    created = live_api.post("/api/v1/agents/", json=NEW, headers=write)
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["slug"], body["pushNotificationsEnabled"], body["pushRebindPolicy"]) == (
        "made-by-api",
        True,
        "drain",
    )
    agent = Agent.objects.get(slug="made-by-api")
    # Created through agent_create: its first signing key exists with it.
    assert SigningKey.objects.filter(agent=agent, state=SigningKeyState.ACTIVE).count() == 1
    assert live_api.get("/api/v1/agents/made-by-api", headers=write).json()["name"] == "Made by API"

    change = {
        "pushNotificationsEnabled": False,
        "pushRebindPolicy": "cutover",
        "pushRebindDeadline": 600,
        "skills": [{"id": "s1", "name": "Skill", "description": "does", "tags": ["t"]}],
    }
    updated = live_api.patch("/api/v1/agents/made-by-api", json=change, headers=write)
    assert updated.status_code == 200, updated.text
    assert updated.json()["capabilities"]["pushNotifications"]["on"] is False
    agent.refresh_from_db()
    assert (agent.push_notifications_enabled, agent.push_rebind_policy) == (
        False,
        PushChannelPolicy.CUTOVER,
    )
    assert agent.push_rebind_deadline == 600
    mark_workers_live()  # the card is served once the machinery behind it is live
    card = live.wait_serving(
        live_api.web,
        f"{live_api.web.url}/made-by-api/.well-known/agent-card.json",
        lambda r: r.json()["skills"][0]["id"] == "s1",
    )
    assert card.json()["capabilities"]["pushNotifications"] is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**NEW, "slug": "admin"}, "slug"),
        ({**NEW, "skills": [{"id": 5, "name": ["not", "a", "name"]}]}, "card"),
        ({**NEW, "pushRebindPolicy": "sideways"}, "pushRebindPolicy"),
        ({**NEW, "pushRebindDeadline": 10**9}, "pushRebindDeadline"),
        ({"slug": "no-name"}, "name"),
    ],
)
def test_bad_agents_are_400_naming_the_field_and_nothing_is_written(live_api, write, body, field):
    answer = live_api.post("/api/v1/agents/", json=body, headers=write)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert field in error["fields"], error
    assert not Agent.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"files": {"slug": (None, "made-by-api")}, "data": {"name": "Made", "description": "a"}},
        {"data": {**NEW, "enabled": "false"}},
    ],
    ids=["multipart", "form"],
)
def test_a_body_that_is_not_json_is_415_and_nothing_is_written(live_api, write, body):
    answer = live_api.post("/api/v1/agents/", headers=write, **body)
    assert answer.status_code == 415, answer.text
    assert answer.json()["error"]["code"] == "unsupported_media_type"
    assert not Agent.objects.exists()


HOSTED = "python:my_pkg.agents:CurrencyAgentExecutor"


def test_an_agent_with_a_hosted_executor_is_created_and_updated(live_api, write):
    created = live_api.post("/api/v1/agents/", json={**NEW, "executor": HOSTED}, headers=write)
    assert created.status_code == 201, created.text
    assert created.json()["executor"] == HOSTED
    changed = live_api.patch(
        "/api/v1/agents/made-by-api", json={"executor": "python:other.mod:make"}, headers=write
    )
    assert changed.status_code == 200, changed.text
    assert Agent.objects.get(slug="made-by-api").executor == "python:other.mod:make"
    listed = live_api.get("/api/v1/agents/?executor=python:other.mod:make", headers=write)
    assert [a["slug"] for a in listed.json()["results"]] == ["made-by-api"]


@pytest.mark.parametrize(
    ("executor", "says"),
    [
        ("magic", "unknown executor"),
        ("python:x", "python:<module>:<attribute>"),
        ("python:my-pkg:X", "is not a module path"),
        ("python:pkg:1X", "is not a Python identifier"),
    ],
)
def test_a_bad_executor_is_400_naming_it_and_nothing_is_written(live_api, write, executor, says):
    answer = live_api.post("/api/v1/agents/", json={**NEW, "executor": executor}, headers=write)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert says in " ".join(error["fields"]["executor"]), error
    assert not Agent.objects.exists()
    kept = AgentFactory(slug="kept", executor="echo")
    patched = live_api.patch("/api/v1/agents/kept", json={"executor": executor}, headers=write)
    assert patched.status_code == 400, patched.text
    assert "executor" in patched.json()["error"]["fields"]
    kept.refresh_from_db()
    assert kept.executor == "echo"


def test_a_bad_update_changes_nothing(live_api, write):
    agent = AgentFactory(slug="kept", description="before")
    answer = live_api.patch(
        "/api/v1/agents/kept",
        json={"description": "after", "skills": [{"id": {"nested": 1}}]},
        headers=write,
    )
    assert answer.status_code == 400, answer.text
    agent.refresh_from_db()
    assert (agent.description, agent.skills) == ("before", [])
    renamed = live_api.patch("/api/v1/agents/kept", json={"slug": "other"}, headers=write)
    assert renamed.status_code == 400
    assert "slug" in renamed.json()["error"]["fields"]


def test_a_read_token_reads_but_cannot_write_and_nothing_changes(live_api, read):
    AgentFactory(slug="watched", streaming_enabled=True)
    assert live_api.get("/api/v1/agents/", headers=read).status_code == 200
    refused = [
        live_api.post("/api/v1/agents/", json=NEW, headers=read),
        live_api.patch("/api/v1/agents/watched", json={"streamingEnabled": False}, headers=read),
        live_api.post("/api/v1/agents/watched/keys/", json={"name": "k"}, headers=read),
        live_api.post("/api/v1/agents/watched/signing-keys/rotate", json={}, headers=read),
    ]
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "permission_denied"
    assert list(Agent.objects.values_list("slug", "streaming_enabled")) == [("watched", True)]
    assert not ApiKey.objects.exists()
    assert not Rebind.objects.exists()


def test_a_scope_never_lends_what_the_user_lacks(live_api):
    viewer = user_with("viewer-only", "view_agent")
    answer = live_api.post("/api/v1/agents/", json=NEW, headers=bearer(token_for(viewer, "rebind")))
    assert answer.status_code == 403
    assert not Agent.objects.exists()


def test_revoked_expired_and_unknown_tokens_are_401(live_api, operator):
    new = api_token_create(name="t", scope="read", user=operator, created_by=None)
    assert live_api.get("/api/v1/agents/", headers=bearer(new.secret)).status_code == 200
    api_token_revoke(token_id=new.token.pk, actor="test")
    for headers in (
        bearer(new.secret),
        bearer(new.secret[:-2] + "xx"),
        bearer("a2apt_000000000000_nope"),
        {"Authorization": "Token abc"},
    ):
        answer = live_api.get("/api/v1/agents/", headers=headers)
        assert answer.status_code == 401, (headers, answer.text)
        assert answer.json()["error"]["code"] == "authentication_failed"
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    anonymous = live_api.get("/api/v1/agents/")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "not_authenticated"


def test_api_keys_secret_once_then_listed_without_it_and_revoked(live_api, write):
    AgentFactory(slug="keyed", executor="external")
    created = live_api.post(
        "/api/v1/agents/keyed/keys/", json={"name": "backend", "kind": "worker"}, headers=write
    )
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]
    assert secret.startswith("a2a_")
    worker = {"Authorization": f"Bearer {secret}"}
    assert live_api.get("/api/v1/worker/tasks", headers=worker).status_code == 200
    listed = live_api.get("/api/v1/agents/keyed/keys/", headers=write).json()["results"]
    assert [k["name"] for k in listed] == ["backend"]
    assert "secret" not in listed[0]
    assert secret not in str(listed)
    key_id = listed[0]["id"]
    revoked = live_api.post(f"/api/v1/agents/keyed/keys/{key_id}/revoke", headers=write)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["revokedAt"]
    assert live_api.get("/api/v1/worker/tasks", headers=worker).status_code == 401
    other = live_api.post(
        "/api/v1/agents/nobody/keys/00000000-0000-0000-0000-000000000000/revoke", headers=write
    )
    assert other.status_code == 404
    assert other.json()["error"]["code"] == "not_found"


def test_signing_keys_show_public_parts_and_rotate_through_a_rebind(live_api, write):
    from agents.services import agent_create

    agent = agent_create(slug="signer", name="S", description="d")
    listed = live_api.get("/api/v1/agents/signer/signing-keys/", headers=write)
    assert listed.status_code == 200, listed.text
    (key,) = listed.json()["results"]
    assert (key["alg"], key["state"]) == ("EdDSA", "active")
    assert set(key["jwk"]) >= {"kty", "crv", "x", "kid"}
    assert "private" not in listed.text.lower()
    rotated = live_api.post(
        "/api/v1/agents/signer/signing-keys/rotate", json={"reason": "yearly"}, headers=write
    )
    assert rotated.status_code == 201, rotated.text
    rebind = Rebind.objects.get(pk=rotated.json()["id"])
    assert (rebind.agent_id, rebind.rotate_key, rebind.actor) == (
        agent.pk,
        True,
        "api:integrator",
    )
    assert OperatorAction.objects.filter(action="rebind_start", actor="api:integrator").exists()
    states = sorted(SigningKey.objects.filter(agent=agent).values_list("state", flat=True))
    assert len(states) == 2  # the next key is published (or already active) beside the old one
    again = live_api.post("/api/v1/agents/signer/signing-keys/rotate", json={}, headers=write)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "rebind_conflict"
    assert Rebind.objects.count() == 1


def test_making_an_agent_the_default_moves_the_role(live_api, write):
    old = AgentFactory(slug="old-root", is_default=True)
    AgentFactory(slug="new-root")
    answer = live_api.patch("/api/v1/agents/new-root", json={"isDefault": True}, headers=write)
    assert answer.status_code == 200, answer.text
    assert list(Agent.objects.filter(is_default=True).values_list("slug", flat=True)) == [
        "new-root"
    ]
    old.refresh_from_db()
    assert not old.is_default
