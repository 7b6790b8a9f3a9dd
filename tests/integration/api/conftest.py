"""The management API's tests run over real HTTP against a live web process (uvicorn serving
the ASGI app, tests/live.py) on the test database: the test process writes through the
services and commits (transactional tests), the web process answers the requests, and the
test reads the rows the API wrote. One web process serves a whole module.

`api_web` is the process; `http` an httpx client on its origin; `public_dns` makes host names
under example.org resolve to a public address in this process (the services registering a
webhook here check the SSRF policy; the web process resolves for real, so a webhook the API
registers points at loopback, which `A2A_WEBHOOK_ALLOWED_NETWORKS` allows there).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests import live
from tests.integration.webhooks.conftest import public_dns  # noqa: F401 (fixture)
from tests.webhook_checks import ALLOWED


@pytest.fixture(scope="module")
def _api_web(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[live.LiveWeb]:
    web = live.start_web(
        tmp_path_factory.mktemp("api-web"),
        name="api-web",
        A2A_WEBHOOK_ALLOWED_NETWORKS=ALLOWED,
        A2A_SHUTDOWN_GRACE_SECONDS="0",
        A2A_AGENT_CACHE_SECONDS="0",
    )
    try:
        yield web
    finally:
        web.stop()
        print(f"----- api-web log (tail) -----\n{web.log()[-4000:]}")  # noqa: T201


@pytest.fixture
def api_web(transactional_db, _api_web) -> live.LiveWeb:
    """The live web process; the test's own writes are committed (transactional_db), so the
    process sees them, and flushed after the test."""
    return _api_web


@pytest.fixture
def http(api_web) -> Iterator[httpx.Client]:
    """An httpx client on the live process's origin (no credentials: see `api_client`)."""
    with httpx.Client(base_url=api_web.url, timeout=30) as client:
        yield client


class Tokens:
    """Integrators' tokens made through the API's own service (tests/api_tokens.py): each acts
    as a staff user who holds every operator permission (the `rebind operator` group), so
    what a token may do is decided by its scope alone; `user_perms` narrows the user instead."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.clients: list[httpx.Client] = []

    def user(self, name: str, *, group: str | None = "rebind operator", staff: bool = True):
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group

        user = get_user_model().objects.create_user(name, is_staff=staff)
        if group is not None:
            user.groups.add(Group.objects.get(name=group))
        return user

    def client(self, scope: str, *, name: str | None = None, user=None) -> httpx.Client:
        """An httpx client on the live process sending `Authorization: Bearer <secret>`."""
        from tests.api_tokens import bearer, token_for

        name = name or f"{scope}-integrator-{len(self.clients) + 1}"
        user = user or self.user(f"{name}-user")
        secret = token_for(user, scope, name=name)
        client = httpx.Client(base_url=self.url, timeout=30, headers=bearer(secret))
        self.clients.append(client)
        return client


@pytest.fixture
def tokens(api_web) -> Iterator[Tokens]:
    holder = Tokens(api_web.url)
    yield holder
    for client in holder.clients:
        client.close()
