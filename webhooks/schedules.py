"""The platform's periodic jobs: one table, written as django-celery-beat PeriodicTask rows
named as here, by beat itself when it starts (a2a_platform/beat.py: the rows that are missing)
and by `manage.py sync_schedules` (every row, brought back to the settings). Both go by name,
so neither creates a duplicate of the other's.

In webhooks, the top app: the table names jobs of every app (import contracts). No Django import.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from tasks.job_names import SWEEP_DISPATCHES_JOB
from webhooks.job_names import (
    CARD_AGE_CHECK_JOB,
    HEARTBEAT_JOB,
    PURGE_OLD_ROWS_JOB,
    REBIND_MONITOR_JOB,
    SWEEP_DELIVERIES_JOB,
)


@dataclass(frozen=True)
class Schedule:
    job: str
    interval_setting: str  # the setting holding the interval, in seconds
    # Safety nets run on `heartbeat`: a backlog (or a missing consumer) on `agents` or
    # `webhooks` must not stop the jobs that re-enqueue those queues' lost work.
    queue: str = "heartbeat"

    def every(self, settings: Any) -> int:
        return int(getattr(settings, self.interval_setting))


SCHEDULES: dict[str, Schedule] = {
    "sweep executor dispatches": Schedule(SWEEP_DISPATCHES_JOB, "A2A_SWEEP_INTERVAL_SECONDS"),
    "sweep webhook deliveries": Schedule(
        SWEEP_DELIVERIES_JOB, "A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS"
    ),
    "purge old rows": Schedule(PURGE_OLD_ROWS_JOB, "A2A_RETENTION_INTERVAL_SECONDS"),
    # Advances open rebinds: counts, completion, deadlines, scheduled starts
    # (webhooks/rebinds/operations.py).
    "rebind monitor": Schedule(REBIND_MONITOR_JOB, "A2A_REBIND_MONITOR_INTERVAL_SECONDS"),
    "tasks outlive card check": Schedule(CARD_AGE_CHECK_JOB, "A2A_CARD_AGE_CHECK_INTERVAL_SECONDS"),
    # The management API's Idempotency-Key claims older than 24 h (a2a_platform/api/jobs.py;
    # named, not imported: the API is a layer above webhooks).
    "purge idempotency keys": Schedule(
        "platform_api.purge_idempotency_keys", "A2A_RETENTION_INTERVAL_SECONDS"
    ),
    # Readiness: proof of a live worker, end to end (agents/readiness.py).
    "worker heartbeat": Schedule(HEARTBEAT_JOB, "A2A_HEARTBEAT_INTERVAL_SECONDS"),
}


def beat_schedule(settings: Any) -> dict[str, dict[str, Any]]:
    """The table as Celery's `beat_schedule` entries (intervals from `settings`)."""
    return {
        name: {
            "task": s.job,
            "schedule": timedelta(seconds=s.every(settings)),
            "options": {"queue": s.queue},
        }
        for name, s in SCHEDULES.items()
    }
