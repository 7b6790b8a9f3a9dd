"""An operator's session browses the API: every list and read renders as DRF's browsable HTML
(its forms built from the views' serializers), and Swagger UI is served from the package."""

from __future__ import annotations

import pytest

from tests.api_tokens import user_with
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db

PAGES = [
    "/api/v1/agents/",
    "/api/v1/agents/browsed",
    "/api/v1/agents/browsed/keys/",
    "/api/v1/agents/browsed/signing-keys/",
    "/api/v1/alerts/",
    "/api/v1/dashboard",
    "/api/v1/tokens/",
    "/api/v1/rebinds/",
    "/api/v1/deliveries/",
    "/api/v1/tasks/",
    "/api/v1/endpoints/",
]


def test_a_session_browses_every_resource_as_html(client):
    AgentFactory(slug="browsed")
    client.force_login(user_with("boss", superuser=True))
    for url in PAGES:
        page = client.get(url, HTTP_ACCEPT="text/html")
        assert page.status_code == 200, (url, page.content[:300])
        assert page["Content-Type"].startswith("text/html"), url
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"/static/drf_spectacular_sidecar/swagger-ui-dist/" in docs.content


def test_without_a_session_the_html_api_is_a_401_error_body(client):
    page = client.get("/api/v1/agents/", HTTP_ACCEPT="application/json")
    assert page.status_code == 401
    assert page.json()["error"]["code"] == "not_authenticated"
