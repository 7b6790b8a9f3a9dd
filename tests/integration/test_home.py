"""The landing page at `/`: a newcomer who opens the URL `make run` prints (or the admin's
"View site" link) finds what runs here and where everything is."""

from __future__ import annotations

import pytest

from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_the_root_lists_the_agents_their_cards_and_where_everything_is(client):
    default = AgentFactory(slug="front", name="Front desk", is_default=True)
    other = AgentFactory(slug="billing", name="Billing")
    AgentFactory(slug="retired", name="Retired", enabled=False)

    response = client.get("/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    for agent in (default, other):
        assert agent.name in page
        assert f'href="/{agent.slug}/.well-known/agent-card.json"' in page
        assert f'href="/{agent.slug}/.well-known/jwks.json"' in page
        assert f"http://testserver/{agent.slug}" in page
    assert page.index("Front desk") < page.index("Billing")  # the default agent first
    assert 'href="/.well-known/agent-card.json"' in page  # the default agent's root card
    assert "Retired" not in page  # a disabled agent is not served, so not listed
    for link in ("/admin/", "/api/v1/deliveries/", "/healthz", "/readyz"):
        assert f'href="{link}"' in page
    assert "manage.py changepassword admin" in page


def test_the_root_without_agents_says_how_to_create_one(client):
    page = client.get("/").content.decode()
    assert "No agent yet" in page
    assert "manage.py seed_demo" in page


def test_the_root_answers_get_and_head_only(client):
    assert client.head("/").status_code == 200
    assert client.post("/").status_code == 405  # through Django; the ASGI router sends a
    # POST to / to the default agent's JSON-RPC endpoint before Django sees it
