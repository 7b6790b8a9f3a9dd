"""Tokens (/api/v1/tokens/ over an operator's session with CSRF, the command, no secret
ever listed), Idempotency-Key on creating POSTs (a retry is the first answer and creates
nothing; another body is 422; concurrent duplicates create once; the 24-hour purge), cursor
pages and the error bodies, over HTTP against a live web process."""

from __future__ import annotations

import datetime as dt
import io
import threading
import uuid

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from a2a_platform.api.jobs import purge_idempotency_keys_job
from a2a_platform.api.models import ApiToken, IdempotencyKey
from a2a_platform.api.services import api_token_authenticate
from agents.models import Agent, OperatorAction
from tests.api_tokens import bearer, token_for, user_with
from tests.factories import AgentFactory
from tests.integration.api.live_api import _live_api, live_api  # noqa: F401 (fixtures)

NEW = {"slug": "once", "name": "Once", "description": "d"}


def _session(client: httpx.Client, username: str, password: str) -> str:
    """Log in through the admin's login form; returns the CSRF token for writes."""
    page = client.get("/admin/login/")
    client.post(
        "/admin/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": page.cookies["csrftoken"],
            "next": "/admin/",
        },
        headers={"Referer": f"{client.base_url}/admin/login/"},
    )
    assert "sessionid" in client.cookies, "admin login failed"
    return client.cookies["csrftoken"]


def test_an_operator_makes_a_token_in_their_session_its_secret_shown_once(live_api):
    operator = user_with("op", "view_apitoken", "add_apitoken", "change_apitoken", "view_agent")
    operator.set_password("pw-for-tests-1")
    operator.save()
    csrf = _session(live_api, "op", "pw-for-tests-1")
    body = {"name": "ci robot", "scope": "read"}
    no_csrf = live_api.post("/api/v1/tokens/", json=body)
    assert no_csrf.status_code == 403, no_csrf.text
    assert not ApiToken.objects.exists()
    made = live_api.post("/api/v1/tokens/", json=body, headers={"X-CSRFToken": csrf})
    assert made.status_code == 201, made.text
    secret = made.json()["secret"]
    token = ApiToken.objects.get()
    assert (token.user, token.created_by, token.scope) == (operator, operator, "read")
    assert secret not in str(ApiToken.objects.values())
    assert token.digest != secret
    assert OperatorAction.objects.filter(action="api_token_create", actor="api:op").exists()

    with httpx.Client(base_url=live_api.base_url, timeout=30) as integrator:
        assert integrator.get("/api/v1/agents/", headers=bearer(secret)).status_code == 200
        listed = live_api.get("/api/v1/tokens/").json()["results"]
        assert [t["prefix"] for t in listed] == [token.prefix]
        assert "secret" not in listed[0]
        assert "digest" not in listed[0]
        # Tokens are never made, nor revoked, by a token (no scope holds those permissions).
        by_token = integrator.post("/api/v1/tokens/", json=body, headers=bearer(secret))
        assert by_token.status_code == 403
        revoked = live_api.post(f"/api/v1/tokens/{token.pk}/revoke", headers={"X-CSRFToken": csrf})
        assert revoked.status_code == 200, revoked.text
        assert revoked.json()["revokedAt"]
        assert integrator.get("/api/v1/agents/", headers=bearer(secret)).status_code == 401


def test_only_a_superuser_makes_a_token_for_someone_else(live_api):
    user_with("other", "view_agent")
    operator = user_with("op2", "view_apitoken", "add_apitoken")
    operator.set_password("pw-for-tests-2")
    operator.save()
    csrf = _session(live_api, "op2", "pw-for-tests-2")
    answer = live_api.post(
        "/api/v1/tokens/",
        json={"name": "x", "scope": "operate", "user": "other"},
        headers={"X-CSRFToken": csrf},
    )
    assert answer.status_code == 400, answer.text
    assert "user" in answer.json()["error"]["fields"]
    assert not ApiToken.objects.exists()


@pytest.mark.django_db
def test_the_command_prints_the_secret_once():
    user = user_with("robot-owner", "view_agent")
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "create_api_token", "robot-owner", "--name", "robot", "--scope", "read",
        stdout=out, stderr=err,
    )  # fmt: skip
    secret = out.getvalue().strip()
    token = api_token_authenticate(secret)
    assert token is not None
    assert (token.user, token.scope, token.name) == (user, "read", "robot")
    assert secret not in err.getvalue()


# --- Idempotency-Key -------------------------------------------------------------------------


@pytest.fixture
def writer():
    return bearer(token_for(user_with("maker", "view_agent", "add_agent"), "operate"))


def test_a_retry_with_the_same_key_is_the_first_answer_and_creates_nothing(live_api, writer):
    key = {"Idempotency-Key": str(uuid.uuid4())}
    first = live_api.post("/api/v1/agents/", json=NEW, headers={**writer, **key})
    assert first.status_code == 201, first.text
    retry = live_api.post("/api/v1/agents/", json=NEW, headers={**writer, **key})
    assert (retry.status_code, retry.json()) == (201, first.json())
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert Agent.objects.count() == 1

    other = live_api.post(
        "/api/v1/agents/", json={**NEW, "slug": "twice"}, headers={**writer, **key}
    )
    assert other.status_code == 422, other.text
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert Agent.objects.count() == 1
    # Keys belong to their principal: another token's same key is a new request.
    stranger = bearer(token_for(user_with("maker2", "view_agent", "add_agent"), "operate"))
    theirs = live_api.post(
        "/api/v1/agents/", json={**NEW, "slug": "theirs"}, headers={**stranger, **key}
    )
    assert theirs.status_code == 201
    # Without the header nothing is remembered: a second create of the slug is refused.
    plain = live_api.post("/api/v1/agents/", json=NEW, headers=writer)
    assert plain.status_code == 400
    assert Agent.objects.count() == 2


def test_a_replayed_key_or_token_creation_never_shows_or_keeps_its_secret(live_api):
    """Shown once, never kept: a retry with the same Idempotency-Key is the first answer
    (the same key, nothing made twice) with its secret null, and the claim's stored answer
    holds no secret; the secret the first answer showed works."""
    AgentFactory(slug="keyed")
    maker = bearer(token_for(user_with("keymaker", "view_apikey", "add_apikey"), "operate"))
    key = {"Idempotency-Key": "key-once"}
    first = live_api.post(
        "/api/v1/agents/keyed/keys/", json={"name": "backend"}, headers={**maker, **key}
    )
    assert first.status_code == 201, first.text
    secret = first.json()["secret"]
    assert secret
    retry = live_api.post(
        "/api/v1/agents/keyed/keys/", json={"name": "backend"}, headers={**maker, **key}
    )
    assert retry.status_code == 201, retry.text
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json() == {**first.json(), "secret": None}
    assert Agent.objects.get(slug="keyed").api_keys.count() == 1
    stored = IdempotencyKey.objects.get(key="key-once")
    assert secret not in str(stored.response)

    # A management token made in an operator's session: the same.
    get_user_model().objects.create_superuser("tokens-root", password="pw-tokens-root")
    with httpx.Client(base_url=live_api.base_url, timeout=30) as session:
        csrf = _session(session, "tokens-root", "pw-tokens-root")
        headers = {"X-CSRFToken": csrf, "Idempotency-Key": "token-once"}
        body = {"name": "ci", "scope": "read"}
        made = session.post("/api/v1/tokens/", json=body, headers=headers)
        assert made.status_code == 201, made.text
        again = session.post("/api/v1/tokens/", json=body, headers=headers)
    assert again.json() == {**made.json(), "secret": None}
    assert made.json()["secret"] not in str(IdempotencyKey.objects.get(key="token-once").response)
    assert ApiToken.objects.filter(name="ci").count() == 1
    assert api_token_authenticate(made.json()["secret"]) is not None


def test_a_refusal_is_kept_too_and_a_bad_key_is_400(live_api, writer):
    key = {"Idempotency-Key": "refused-once"}
    bad = {**NEW, "slug": "admin"}
    first = live_api.post("/api/v1/agents/", json=bad, headers={**writer, **key})
    retry = live_api.post("/api/v1/agents/", json=bad, headers={**writer, **key})
    assert first.status_code == retry.status_code == 400
    assert first.json() == retry.json()
    too_long = live_api.post(
        "/api/v1/agents/", json=NEW, headers={**writer, "Idempotency-Key": "k" * 256}
    )
    assert too_long.status_code == 400
    assert "Idempotency-Key" in too_long.json()["error"]["fields"]
    assert not Agent.objects.exists()


def test_concurrent_duplicates_create_once(live_api, writer):
    key = {"Idempotency-Key": "race-1"}
    answers: list[httpx.Response] = []
    start = threading.Barrier(6)

    def post():
        with httpx.Client(base_url=live_api.base_url, timeout=30) as client:
            start.wait()
            answers.append(client.post("/api/v1/agents/", json=NEW, headers={**writer, **key}))

    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Agent.objects.count() == 1
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) <= {201, 409}, [a.text for a in answers]
    created = [a for a in answers if a.status_code == 201]
    assert created, statuses
    assert all(a.json() == created[0].json() for a in created)
    for busy in (a for a in answers if a.status_code == 409):
        assert busy.json()["error"]["code"] == "idempotency_in_progress"
        assert busy.headers["Retry-After"] == "1"
    assert IdempotencyKey.objects.count() == 1


def test_claims_older_than_a_day_are_purged_by_the_beat_job(live_api, writer):
    for key in ("old", "new"):
        live_api.post(
            "/api/v1/agents/", json={**NEW, "slug": key}, headers={**writer, "Idempotency-Key": key}
        )
    IdempotencyKey.objects.filter(key="old").update(
        created_at=timezone.now() - dt.timedelta(hours=24, minutes=1)
    )
    assert purge_idempotency_keys_job() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]


# --- pages and error bodies ------------------------------------------------------------------


def test_cursor_pages_walk_every_row_once_in_the_asked_order(live_api):
    for i in range(7):
        AgentFactory(slug=f"paged-{i}")
    reader = bearer(token_for(user_with("reader", "view_agent"), "read"))
    seen, url = [], "/api/v1/agents/?pageSize=3&ordering=-slug"
    while url:
        page = live_api.get(url, headers=reader)
        assert page.status_code == 200, page.text
        assert len(page.json()["results"]) <= 3
        seen += [a["slug"] for a in page.json()["results"]]
        url = page.json()["next"]
    assert seen == [f"paged-{i}" for i in reversed(range(7))]
    for query, field in [
        ("ordering=digest", "ordering"),
        ("cursor=not-a-cursor", "cursor"),
        ("executor=warp", "executor"),
        ("enabled=a%00b", "enabled"),
    ]:
        bad = live_api.get(f"/api/v1/agents/?{query}", headers=reader)
        assert bad.status_code == 400, (query, bad.text)
        assert field in bad.json()["error"]["fields"], bad.json()


def test_every_failure_has_the_error_body(live_api):
    reader = bearer(token_for(user_with("reader2", "view_agent"), "read"))
    cases = [
        (live_api.get("/api/v1/nowhere", headers=reader), 404, "not_found"),
        (live_api.get("/api/v1/agents/ghost", headers=reader), 404, "not_found"),
        (live_api.delete("/api/v1/agents/", headers=reader), 405, "method_not_allowed"),
        (
            live_api.post(
                "/api/v1/agents/",
                content=b"{not json",
                headers={**reader, "Content-Type": "application/json"},
            ),
            403,
            "permission_denied",
        ),
        (live_api.get("/api/v1/agents/"), 401, "not_authenticated"),
    ]
    for answer, status, code in cases:
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert (error["code"], bool(error["message"])) == (code, True)
    maker = bearer(token_for(user_with("maker3", "view_agent", "add_agent"), "operate"))
    broken = live_api.post(
        "/api/v1/agents/",
        content=b"{not json",
        headers={**maker, "Content-Type": "application/json"},
    )
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == "parse_error"
