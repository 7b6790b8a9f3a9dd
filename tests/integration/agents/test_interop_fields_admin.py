"""The interoperability switches of issue 18 are agent settings an operator sees and sets in
the agent admin's form (and the executor choice lists `conformance`)."""

from __future__ import annotations

import pytest

from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_the_agent_form_shows_the_switches(admin_client):
    agent = AgentFactory(slug="ops", executor="echo")
    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'name="anonymous_list_tasks"' in html
    assert 'name="strict_version_header"' in html
    assert '<option value="conformance">' in html
    assert '<option value="anonymous">' in html
