"""An agent's, its API keys' and its signing keys' changes are audited by their own services,
in their own transaction (`OperatorAction` lives in agents since issue 44, its table kept), and
every interface (the admin, the management API, the console's key retirement, the commands)
names who asked.

Same transaction: an audit that fails takes the change with it. Every interface: each one's
row names its operator (an interface that bypassed the service, or did not pass who asked,
writes no row or a "system" one).
"""

from __future__ import annotations

import io
from unittest import mock

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.db import connection
from django.test import RequestFactory

from agents.models import Agent, ApiKey, OperatorAction, SigningKey, SigningKeyState
from agents.services import agent_create, agent_save, agent_update, api_key_create, api_key_revoke
from agents.signing import signing_key_retire, signing_key_rotate
from tests.api_tokens import api_client
from tests.factories import AgentFactory
from webhooks.console.operator_groups import sync_groups

pytestmark = pytest.mark.django_db


class AuditDown(Exception):
    """The audit's write failed."""


def _audit_fails():
    return mock.patch.object(OperatorAction, "record", side_effect=AuditDown)


def _retiring(agent: Agent) -> SigningKey:
    old = SigningKey.objects.get(agent=agent, state=SigningKeyState.ACTIVE)
    signing_key_rotate(agent=agent)
    return old


@pytest.mark.parametrize(
    "change",
    ["agent_create", "agent_update", "agent_save", "api_key_create", "api_key_revoke", "retire"],
)
def test_a_failed_audit_takes_the_change_with_it(change):
    agent = AgentFactory(slug="audited", signing_key=True)
    key = api_key_create(agent=agent, name="k").key
    old = _retiring(agent)
    before = (
        list(Agent.objects.order_by("pk").values()),
        list(ApiKey.objects.order_by("pk").values()),
        list(SigningKey.objects.order_by("pk").values()),
    )
    calls = {
        "agent_create": lambda: agent_create(slug="new", name="N", description="d", actor="ops"),
        "agent_update": lambda: agent_update(
            agent_pk=agent.pk, changes={"name": "renamed"}, actor="ops"
        ),
        "agent_save": lambda: agent_save(agent=_renamed(agent), actor="ops"),
        "api_key_create": lambda: api_key_create(agent=agent, name="k2", actor="ops"),
        "api_key_revoke": lambda: api_key_revoke(key_id=key.pk, actor="ops"),
        "retire": lambda: signing_key_retire(key_id=old.pk, actor="ops"),
    }
    with _audit_fails(), pytest.raises(AuditDown):
        calls[change]()
    after = (
        list(Agent.objects.order_by("pk").values()),
        list(ApiKey.objects.order_by("pk").values()),
        list(SigningKey.objects.order_by("pk").values()),
    )
    assert after == before


def _renamed(agent: Agent) -> Agent:
    agent = Agent.objects.get(pk=agent.pk)
    agent.name = "renamed"
    return agent


def test_each_change_is_audited_once_with_who_asked():
    agent = agent_create(slug="audited", name="A", description="d", actor="ops")
    key = api_key_create(agent=agent, name="k", actor="ops").key
    api_key_revoke(key_id=key.pk, actor="ops")
    api_key_revoke(key_id=key.pk, actor="ops")  # already revoked: nothing changes, no row
    old = _retiring(agent)
    signing_key_retire(key_id=old.pk, actor="ops")
    signing_key_retire(key_id=old.pk, actor="ops")
    agent_update(agent_pk=agent.pk, changes={"name": "B"}, actor="ops")
    rows = list(OperatorAction.objects.order_by("pk").values_list("actor", "action", "target"))
    assert rows == [
        ("ops", "create_agent", {"agent": agent.pk, "slug": "audited"}),
        ("ops", "create_api_key", {"agent": agent.pk, "key": str(key.pk), "prefix": key.prefix}),
        ("ops", "revoke_api_key", {"agent": agent.pk, "key": str(key.pk), "prefix": key.prefix}),
        ("ops", "retire_signing_key", {"agent": agent.pk, "kid": old.kid}),
        ("ops", "change_agent", {"agent": agent.pk, "slug": "audited", "fields": ["name"]}),
    ]
    assert OperatorAction._meta.db_table == "webhooks_operatoraction"  # the table kept
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM webhooks_operatoraction")
        assert cursor.fetchone() == (len(rows),)


def test_the_api_audits_agent_and_key_changes_as_its_caller():
    api = api_client("integrator", "add_agent", "change_agent", "add_apikey", "change_apikey")
    created = api.post(
        "/api/v1/agents/", {"slug": "api-made", "name": "A", "description": "d"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert api.patch("/api/v1/agents/api-made", {"name": "B"}, format="json").status_code == 200
    key = api.post("/api/v1/agents/api-made/keys/", {"name": "k"}, format="json").json()
    revoked = api.post(f"/api/v1/agents/api-made/keys/{key['id']}/revoke", format="json")
    assert revoked.status_code == 200, revoked.content
    audited = OperatorAction.objects.exclude(action="api_token_create").order_by("pk")
    assert list(audited.values_list("actor", "action")) == [
        ("api:integrator", "create_agent"),
        ("api:integrator", "change_agent"),
        ("api:integrator", "create_api_key"),
        ("api:integrator", "revoke_api_key"),
    ]


def test_the_admin_audits_agent_edits_and_key_revocations_as_its_user(admin_client):
    agent = AgentFactory(slug="admin-made", signing_key=True)
    key = api_key_create(agent=agent, name="k").key
    answer = admin_client.post(
        "/admin/agents/apikey/", {"action": "revoke", "_selected_action": [str(key.pk)]}
    )
    assert answer.status_code == 302
    request = RequestFactory().post("/admin/agents/agent/")
    request.user = get_user_model().objects.get(username="admin")
    site._registry[Agent].save_model(request, _renamed(agent), form=None, change=True)
    audited = OperatorAction.objects.exclude(action="create_api_key").order_by("pk")
    assert list(audited.values_list("actor", "action")) == [
        ("admin", "revoke_api_key"),
        ("admin", "change_agent"),
    ]


def test_the_commands_audit_as_cli():
    call_command(
        "create_agent", "cli-made", "--name", "C", "--description", "d", stdout=io.StringIO()
    )
    call_command(
        "create_api_key", "cli-made", "--name", "k", stdout=io.StringIO(), stderr=io.StringIO()
    )
    assert list(OperatorAction.objects.order_by("pk").values_list("actor", "action")) == [
        ("cli", "create_agent"),
        ("cli", "create_api_key"),
    ]


def test_operators_keep_seeing_the_audit():
    """Its permissions moved with the model (agents' label, the same rows): the operators'
    groups still hold the view permission, and a viewer may read the audit."""
    sync_groups()
    for name in ("viewer", "operator", "rebind operator"):
        perms = Group.objects.get(name=name).permissions
        assert perms.filter(
            content_type__app_label="agents", codename="view_operatoraction"
        ).exists(), name
    viewer = get_user_model().objects.create_user("viewer", password="x", is_staff=True)
    viewer.groups.add(Group.objects.get(name="viewer"))
    assert viewer.has_perm("agents.view_operatoraction")
