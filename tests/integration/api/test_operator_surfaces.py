"""What an operator found driving the management API from the outside (issue 17's QA pass,
on both stores): each case here answered a 5xx, a 404 for a row that exists, or broke the
documented behaviour, before its fix. Over HTTP against a live web process, on PostgreSQL."""

from __future__ import annotations

import pytest

from agents.models import Agent
from tests.api_tokens import bearer, token_for, user_with
from tests.factories import AgentFactory
from tests.integration.api.live_api import _live_api, live_api  # noqa: F401 (fixtures)

AGENT_PERMS = ("view_agent", "add_agent", "change_agent", "view_apikey", "add_apikey")


@pytest.fixture
def write():
    return bearer(token_for(user_with("qa-operator", *AGENT_PERMS), "operate"))


def _create(live_api, write, slug: str, **extra):
    body = {"slug": slug, "name": "QA", "description": "an agent", **extra}
    return live_api.post("/api/v1/agents/", json=body, headers=write)


def test_a_disabled_agent_is_still_read_and_enabled_again_through_the_api(live_api, write):
    """The list shows disabled agents; reading, editing and listing the keys of one must
    work too, or an operator who disables an agent through the API cannot enable it again."""
    assert _create(live_api, write, "qa-off").status_code == 201
    off = live_api.patch("/api/v1/agents/qa-off", json={"enabled": False}, headers=write)
    assert off.status_code == 200, off.text
    assert off.json()["enabled"] is False
    read = live_api.get("/api/v1/agents/qa-off", headers=write)
    assert read.status_code == 200, read.text
    assert read.json()["enabled"] is False
    keys = live_api.get("/api/v1/agents/qa-off/keys/", headers=write)
    assert keys.status_code == 200, keys.text
    on = live_api.patch("/api/v1/agents/qa-off", json={"enabled": True}, headers=write)
    assert on.status_code == 200, on.text
    assert Agent.objects.get(slug="qa-off").enabled is True


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/api/v1/agents/", "enabled"),
        ("/api/v1/agents/qa-keys/keys/", "revoked"),
        ("/api/v1/alerts/", "open"),
        ("/api/v1/tokens/", "revoked"),
        ("/api/v1/endpoints/", "paused"),
        ("/api/v1/tasks/", "orphaned"),
    ],
)
def test_a_boolean_filter_other_than_true_or_false_is_a_400_naming_it(live_api, path, name):
    """docs/api.md: a bad filter value is a 400 naming the filter (django-filter's own
    BooleanFilter read `maybe` as "not given" and listed everything)."""
    user = user_with(
        "qa-reader",
        "view_agent",
        "view_apikey",
        "view_alert",
        "view_apitoken",
        "view_endpoint",
        "view_task",
    )
    read = bearer(token_for(user, "read"))
    AgentFactory(slug="qa-keys")
    for value in ("true", "false"):
        assert live_api.get(path, params={name: value}, headers=read).status_code == 200
    answer = live_api.get(path, params={name: "maybe"}, headers=read)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert name in error.get("fields", {}) or error.get("field") == name, error
