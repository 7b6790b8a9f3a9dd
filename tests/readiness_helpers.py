"""What a live worker writes for the readiness gate (agents/readiness.py), for tests that
exercise the protocol rather than the gate. The gate itself is tested with real worker and
beat processes (tests/fault/agents/)."""

from __future__ import annotations

import httpx

from agents import readiness
from tests.processes import wait_until


def mark_workers_live(
    hostname: str = "test-worker",
    queues: tuple[str, ...] = ("agents", "heartbeat", "webhooks"),
    *,
    web_url: str | None = None,
) -> None:
    """Write a live worker's rows; with `web_url`, also wait until that web process's
    readiness sees them. Its readiness is cached for A2A_READINESS_CACHE_SECONDS, so a
    reading taken just before these rows were written (its own instance heartbeat, after the
    previous test flushed the rows) still refuses push registrations for up to that long."""
    readiness.worker_started(hostname=hostname, queues=list(queues), backlog_reenqueued=True)
    readiness.heartbeat(hostname=hostname)
    readiness.reset_for_tests()
    if web_url is not None:
        wait_until(
            lambda: httpx.get(f"{web_url}/readyz", timeout=5).status_code == 200,
            message=f"the web process at {web_url} ready",
        )
