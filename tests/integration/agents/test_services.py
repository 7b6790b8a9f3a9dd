"""The agents app's outermost services declare their transaction (durable): a caller's
transaction around them raises instead of silently absorbing their commit."""

from __future__ import annotations

import pytest
from django.db import transaction

from agents.models import Agent, SigningKey
from agents.services import agent_create, agent_save, api_key_create, api_key_revoke
from agents.signing import signing_key_create, signing_key_retire, signing_key_rotate
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_agent_create_is_outermost():
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        agent_create(slug="x", name="X", description="d")
    assert not Agent.objects.filter(slug="x").exists()


def test_api_key_revoke_is_outermost(agent):
    key = api_key_create(agent=agent, name="k").key
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        api_key_revoke(key_id=key.pk, actor="test")
    key.refresh_from_db()
    assert key.revoked_at is None
    assert api_key_revoke(key_id=key.pk, actor="test").revoked_at is not None


def test_signing_key_services_are_outermost(db):
    agent = AgentFactory(signing_key=False)
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        signing_key_create(agent=agent)
    assert not SigningKey.objects.filter(agent=agent).exists()
    old = signing_key_create(agent=agent)
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        signing_key_rotate(agent=agent)
    signing_key_rotate(agent=agent)
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        signing_key_retire(key_id=old.pk, actor="test")
    assert signing_key_retire(key_id=old.pk, actor="test").state == "retired"


def test_agent_save_runs_inside_the_admins_transaction(agent):
    """Not durable: the admin's change form wraps save_model in its own transaction."""
    agent.name = "renamed"
    with transaction.atomic():
        agent_save(agent=agent, actor="test")
    agent.refresh_from_db()
    assert agent.name == "renamed"
