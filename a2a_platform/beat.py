"""Beat's scheduler (CELERY_BEAT_SCHEDULER): django-celery-beat's DatabaseScheduler that writes
the platform's periodic jobs (webhooks/schedules.py) when it starts, so a fresh database needs
no `manage.py sync_schedules` before `celery -A a2a_platform beat` heartbeats.

It writes only the schedules that are missing, by name: a row that exists, written by
`sync_schedules`, an earlier start or an operator in the admin, is left as it is (its interval,
queue, enabled flag). `sync_schedules` is the command that brings existing rows back to the
settings. Either way one row per name: neither duplicates the other.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler

from webhooks.schedules import beat_schedule

logger = logging.getLogger(__name__)


class PlatformScheduler(DatabaseScheduler):
    def setup_schedule(self) -> None:
        table = beat_schedule(settings)
        existing = set(PeriodicTask.objects.filter(name__in=table).values_list("name", flat=True))
        for name, entry in table.items():
            if name not in existing:
                self.Entry.from_entry(name, app=self.app, **entry)
                logger.info("beat wrote the missing schedule %r (%s)", name, entry["task"])
        super().setup_schedule()
