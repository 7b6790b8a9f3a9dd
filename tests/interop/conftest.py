"""A live platform for interop tests: uvicorn (tests.live) + a Celery worker, on the test
database and broker, shared by the tests of a module (starting them costs seconds).

The processes are module-scoped; the data is not: `live_platform` needs `transactional_db`,
so what a test writes is committed (the children read it) and flushed after the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agents.models import Agent, AuthMode
from agents.services import api_key_create
from tests import live, processes
from tests.factories import AgentFactory
from tests.readiness_helpers import mark_workers_live


@dataclass
class LivePlatform:
    web: live.LiveWeb
    worker: processes.Proc

    @property
    def url(self) -> str:
        """The origin, `http://127.0.0.1:<port>` (no trailing slash)."""
        return self.web.url

    def agent_url(self, agent: Agent) -> str:
        """Where the agent's card is resolved from: the origin for the default agent."""
        return self.url if agent.is_default else f"{self.url}/{agent.slug}"

    def logs(self) -> str:
        web, worker = self.web.log()[-4000:], self.worker.log()[-4000:]
        return f"--- web ---\n{web}\n--- worker ---\n{worker}"


@pytest.fixture(scope="module")
def live_worker_options() -> dict[str, Any]:
    """How `_live_processes` starts its worker: tests.processes.start_worker's arguments
    (name, pool, concurrency, env). A module that needs another worker overrides this."""
    return {}


@pytest.fixture(scope="module")
def _live_processes(
    django_db_setup, django_db_blocker, tmp_path_factory, live_worker_options
) -> Iterator[LivePlatform]:
    log_dir = tmp_path_factory.mktemp("live")
    worker = processes.start_worker(log_dir, **live_worker_options)
    try:
        web = live.start_web(log_dir)
    except BaseException:
        worker.stop()
        raise
    try:
        yield LivePlatform(web=web, worker=worker)
    finally:
        web.stop()
        worker.stop()


@pytest.fixture
def live_platform(transactional_db, _live_processes) -> LivePlatform:
    """A running web + worker; this test's committed data is visible to both. The worker's
    readiness rows are flushed with every test's data, so they are written again here (the
    gate itself is tested with real beat heartbeats in tests/fault/agents/)."""
    # A web process started for this session has never been ready: its cards answer 503
    # until its readiness sees the live workers (a test that reads a card at once needs it).
    mark_workers_live(web_url=_live_processes.web.url)
    return _live_processes


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    funcargs = getattr(item, "funcargs", {})
    # `instances`: the web instances of test_streaming_live.py.
    platform = funcargs.get("live_platform") or funcargs.get("instances")
    if report.failed and platform is not None:
        report.sections.append(("live platform logs", platform.logs()))
    return report


# --- Agents ---------------------------------------------------------------------------------


@pytest.fixture
def default_agent(live_platform) -> Agent:
    """The scripted agent served at the origin root (once the web process's cached default,
    an earlier test's agent, has expired: tests.live.wait_serving_default)."""
    agent = AgentFactory(executor="scripted", is_default=True)
    live.wait_serving_default([live_platform.web], agent.name)
    return agent


@pytest.fixture
def tenant_agent(live_platform) -> Agent:
    """A scripted agent served under /<slug> only."""
    return AgentFactory(executor="scripted")


@dataclass
class KeyedAgent:
    agent: Agent
    token: str  # a client API key of the agent
    other_token: str  # another client key: another principal


@pytest.fixture
def keyed_agent(live_platform) -> KeyedAgent:
    agent = AgentFactory(executor="scripted", auth_mode=AuthMode.API_KEY)
    return KeyedAgent(
        agent=agent,
        token=api_key_create(agent=agent, name="interop client").token,
        other_token=api_key_create(agent=agent, name="another client").token,
    )
