"""The Celery app. Jobs live in each app's jobs.py ("task" always means the A2A Task)."""

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")

app = Celery("a2a_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = (Queue("agents"), Queue("webhooks"), Queue("heartbeat"))
app.conf.task_routes = {
    "tasks.*": {"queue": "agents"},
    "webhooks.*": {"queue": "webhooks"},
    "heartbeat.*": {"queue": "heartbeat"},
}
app.autodiscover_tasks(related_name="jobs")
