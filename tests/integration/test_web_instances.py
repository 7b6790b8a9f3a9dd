"""Every web instance on the dashboard: each web process writes its readiness (agents.WebInstance)
every A2A_WEB_HEARTBEAT_SECONDS, so the dashboard served by any one of them shows them all,
a draining one as draining and a stopped one as stale. Real uvicorn processes on the test
database."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from agents.models import WebInstance
from tests import live
from tests.processes import wait_until
from webhooks.console.dashboard import dashboard_data

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEAT = "0.3"


def instances() -> dict[str, dict]:
    return {w["name"]: w for w in dashboard_data()["readiness"]["webInstances"]}


def test_the_dashboard_lists_every_web_instance_with_its_readiness(tmp_path):
    first = live.start_web(tmp_path, name="web-a", A2A_WEB_HEARTBEAT_SECONDS=BEAT)
    second = live.start_web(
        tmp_path, name="web-b", A2A_WEB_HEARTBEAT_SECONDS=BEAT, A2A_SHUTDOWN_GRACE_SECONDS="3"
    )
    try:
        names = {f"{socket.gethostname()}:{w.proc.pid}" for w in (first, second)}
        seen = wait_until(
            lambda: instances() if names <= set(instances()) else None,
            message="both web processes' heartbeats",
        )
        for name in names:
            row = seen[name]
            assert row["live"] is True
            assert row["draining"] is False
            # No worker runs here: each says it is not ready, and why.
            assert row["ready"] is False
            assert "agents_worker" in row["failing"]

        # SIGTERM: the instance turns not ready at once and says so while it drains.
        os.kill(second.proc.pid, signal.SIGTERM)
        name = f"{socket.gethostname()}:{second.proc.pid}"
        wait_until(lambda: instances()[name]["draining"] or None, message="the draining instance")
        assert "shutdown" in WebInstance.objects.get(name=name).failing
        second.proc.popen.wait(timeout=30)

        # Stopped, it writes no more: after three intervals it shows as stale; the other
        # one is still live.
        wait_until(
            lambda: instances()[name]["live"] is False or None, message="the stopped one stale"
        )
        assert instances()[f"{socket.gethostname()}:{first.proc.pid}"]["live"] is True
    finally:
        first.stop()
        second.stop()
