"""What a live worker writes for the readiness gate (agents/readiness.py), for tests that
exercise the protocol rather than the gate. The gate itself is tested with real worker and
beat processes (tests/fault/agents/)."""

from __future__ import annotations

from agents import readiness


def mark_workers_live(
    hostname: str = "test-worker", queues: tuple[str, ...] = ("agents", "heartbeat", "webhooks")
) -> None:
    readiness.worker_started(hostname=hostname, queues=list(queues), backlog_reenqueued=True)
    readiness.heartbeat(hostname=hostname)
    readiness.reset_for_tests()
