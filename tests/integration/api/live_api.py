"""A live web process for the management API's end-to-end tests (uvicorn on the ASGI app,
tests/live.py), one per module, on the test database. Tests commit their set-up through the
services (transactional tests), call the API over real HTTP, and read the rows it wrote."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests import live


@pytest.fixture(scope="module")
def _live_api(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[live.LiveWeb]:
    web = live.start_web(
        tmp_path_factory.mktemp("live-api"),
        name="live-api",
        A2A_SHUTDOWN_GRACE_SECONDS="0",
        A2A_AGENT_CACHE_SECONDS="0",
        A2A_API_RATE="100000/minute",
    )
    try:
        yield web
    finally:
        web.stop()


@pytest.fixture
def live_api(transactional_db, _live_api) -> Iterator[httpx.Client]:
    """An httpx client on the live process (no credentials: pass `headers=bearer(...)`)."""
    with httpx.Client(base_url=_live_api.url, timeout=30) as client:
        client.web = _live_api
        yield client
