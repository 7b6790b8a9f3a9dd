from django.conf import settings
from django.core.management.base import BaseCommand
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from webhooks.schedules import SCHEDULES


class Command(BaseCommand):
    help = (
        "Create or update the django-celery-beat schedules the platform needs (idempotent). "
        "Beat writes the same rows when it starts (webhooks/schedules.py): this command is for "
        "writing them without starting beat."
    )

    def handle(self, *args, **opts):
        for name, schedule in SCHEDULES.items():
            every = schedule.every(settings)
            interval, _ = IntervalSchedule.objects.get_or_create(
                every=every, period=IntervalSchedule.SECONDS
            )
            PeriodicTask.objects.update_or_create(
                name=name,
                defaults={
                    "task": schedule.job,
                    "interval": interval,
                    "queue": schedule.queue,
                    "enabled": True,
                },
            )
            self.stdout.write(
                f"schedule `{name}`: {schedule.job} every {every}s on {schedule.queue}"
            )
