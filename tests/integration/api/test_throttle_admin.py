"""The throttle's 429 (a web process with a tiny A2A_API_RATE) and the admin's token page:
created with the secret shown once, never listed, revoked by an action."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from a2a_platform.api.models import ApiToken
from a2a_platform.api.services import api_token_authenticate
from agents.models import OperatorAction
from tests import live
from tests.api_tokens import bearer, token_for, user_with


@pytest.fixture(scope="module")
def slow_web(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[live.LiveWeb]:
    web = live.start_web(
        tmp_path_factory.mktemp("slow-api"), name="slow-api", A2A_API_RATE="3/minute"
    )
    try:
        yield web
    finally:
        web.stop()


def test_past_the_rate_a_token_is_throttled_with_a_retry_hint(transactional_db, slow_web):
    reader = bearer(token_for(user_with("hasty", "view_agent"), "read"))
    other = bearer(token_for(user_with("patient", "view_agent"), "read"))
    with httpx.Client(base_url=slow_web.url, timeout=30) as client:
        answers = [client.get("/api/v1/agents/", headers=reader) for _ in range(4)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        error = answers[-1].json()["error"]
        assert error["code"] == "throttled"
        assert 0 < error["retryAfter"] <= 60
        assert int(answers[-1].headers["Retry-After"]) > 0
        # The budget on every answer: the window's size, what is left, when a request frees.
        assert [a.headers["RateLimit-Limit"] for a in answers] == ["3"] * 4
        assert [a.headers["RateLimit-Remaining"] for a in answers] == ["2", "1", "0", "0"]
        assert all(0 < int(a.headers["RateLimit-Reset"]) <= 60 for a in answers)
        # Per token: another integrator is not slowed by this one.
        assert client.get("/api/v1/agents/", headers=other).status_code == 200


@pytest.mark.django_db
def test_the_admin_makes_a_token_shows_its_secret_once_and_revokes_it(admin_client, admin_user):
    owner = user_with("integrator", "view_agent")
    page = admin_client.post(
        "/admin/platform_api/apitoken/add/",
        {"name": "CI robot", "scope": "read", "user": owner.pk, "expires_at": ""},
    )
    assert page.status_code == 200, page.content[:500]
    assert "no-store" in page["Cache-Control"]
    secret = re.search(rb'id="api-token-secret"[^>]*>(a2apt_[^<]+)<', page.content).group(1)
    token = api_token_authenticate(secret.decode())
    assert token is not None
    assert (token.user, token.created_by, token.scope) == (owner, admin_user, "read")
    listing = admin_client.get("/admin/platform_api/apitoken/")
    assert secret not in listing.content
    assert token.digest.encode() not in listing.content
    detail = admin_client.get(f"/admin/platform_api/apitoken/{token.pk}/change/")
    assert secret not in detail.content
    assert token.digest.encode() not in detail.content
    refused = admin_client.get(
        "/admin/platform_api/apitoken/", {"digest__startswith": token.digest[:8]}
    )
    assert token.prefix.encode() not in refused.content  # the digest is not a filter

    revoked = admin_client.post(
        "/admin/platform_api/apitoken/",
        {"action": "revoke", "_selected_action": [str(token.pk)]},
    )
    assert revoked.status_code == 302
    assert api_token_authenticate(secret.decode()) is None
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    assert OperatorAction.objects.filter(action="api_token_revoke", actor="admin:admin").exists()


@pytest.mark.django_db
def test_the_admin_refuses_a_token_for_someone_else_unless_superuser(client):
    staff = user_with("ops", "view_apitoken", "add_apitoken")
    other = user_with("someone")
    client.force_login(staff)
    page = client.post(
        "/admin/platform_api/apitoken/add/", {"name": "x", "scope": "operate", "user": other.pk}
    )
    assert page.status_code == 200
    assert b"only a superuser" in page.content
    assert not ApiToken.objects.exists()
