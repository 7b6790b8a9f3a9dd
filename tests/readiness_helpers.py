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
    readiness_reset()
    if web_url is not None:
        wait_until(
            lambda: httpx.get(f"{web_url}/readyz", timeout=5).status_code == 200,
            message=f"the web process at {web_url} ready",
        )


def wait_workers_live(web_url: str | None = None, timeout: float = 60) -> None:
    """Where a real worker and beat run: wait until their own rows open the gate, faking
    none. The worker registers as it starts; the first heartbeat job beat sends it (every
    A2A_HEARTBEAT_INTERVAL_SECONDS) makes its row fresh. Waits until this process's readiness,
    read afresh, is ready (the services a test calls in-process, and a server running in this
    process, consult it); with `web_url`, then until that web process answers /readyz 200."""

    def here_ready() -> bool:
        readiness_reset()
        return readiness.compute(include_hub=False).ready

    wait_until(here_ready, timeout=timeout, message="the workers' heartbeats open the gate")
    if web_url is None:
        return

    def web_ready() -> bool:
        try:
            return httpx.get(f"{web_url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(web_ready, timeout=timeout, message=f"the web process at {web_url} ready")


def readiness_reset() -> None:
    """Forget this process's readiness: its cached reading, the drain and the migrations
    check (as a new process starts)."""
    readiness._state = readiness._ProcessState()
