from django.conf import settings
from django.core.management.base import BaseCommand
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from tasks.job_names import SWEEP_DISPATCHES_JOB
from webhooks.job_names import (
    CARD_AGE_CHECK_JOB,
    HEARTBEAT_JOB,
    PURGE_OLD_ROWS_JOB,
    REBIND_MONITOR_JOB,
    SWEEP_DELIVERIES_JOB,
)

# In webhooks, the top app: the schedules name jobs of every app (import contracts).
# Sweepers run on the `heartbeat` queue: a backlog (or a missing consumer) on `agents` or
# `webhooks` must not stop the safety net that re-enqueues their lost work.
SCHEDULES = {
    # name: (job name, setting holding the interval in seconds, queue)
    "sweep executor dispatches": (
        SWEEP_DISPATCHES_JOB,
        "A2A_SWEEP_INTERVAL_SECONDS",
        "heartbeat",
    ),
    "sweep webhook deliveries": (
        SWEEP_DELIVERIES_JOB,
        "A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS",
        "heartbeat",
    ),
    "purge old rows": (PURGE_OLD_ROWS_JOB, "A2A_RETENTION_INTERVAL_SECONDS", "heartbeat"),
    # Advances open rebinds: counts, completion, deadlines, scheduled starts (webhooks/rebind.py).
    "rebind monitor": (REBIND_MONITOR_JOB, "A2A_REBIND_MONITOR_INTERVAL_SECONDS", "heartbeat"),
    "tasks outlive card check": (
        CARD_AGE_CHECK_JOB,
        "A2A_CARD_AGE_CHECK_INTERVAL_SECONDS",
        "heartbeat",
    ),
    # Readiness: proof of a live worker, end to end (agents/readiness.py).
    "worker heartbeat": (HEARTBEAT_JOB, "A2A_HEARTBEAT_INTERVAL_SECONDS", "heartbeat"),
}


class Command(BaseCommand):
    help = "Create or update the django-celery-beat schedules the platform needs (idempotent)."

    def handle(self, *args, **opts):
        for name, (job, setting, queue) in SCHEDULES.items():
            every = int(getattr(settings, setting))
            interval, _ = IntervalSchedule.objects.get_or_create(
                every=every, period=IntervalSchedule.SECONDS
            )
            PeriodicTask.objects.update_or_create(
                name=name,
                defaults={"task": job, "interval": interval, "queue": queue, "enabled": True},
            )
            self.stdout.write(f"schedule `{name}`: {job} every {every}s on {queue}")
