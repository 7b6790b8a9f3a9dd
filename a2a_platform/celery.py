"""The Celery app. Jobs live in each app's jobs.py ("task" always means the A2A Task)."""

import os

from celery import Celery
from celery.signals import worker_process_init, worker_ready
from kombu import Queue

# Leaf modules (no Django import): safe before the apps load.
from a2a_platform.lib.gc_freeze import freeze_startup_heap
from tasks.job_names import SWEEP_DISPATCHES_JOB
from webhooks.job_names import PURGE_OLD_ROWS_JOB, SWEEP_DELIVERIES_JOB

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")

app = Celery("a2a_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
# A plain `celery -A a2a_platform worker` (no -Q) consumes every queue listed here.
app.conf.task_queues = (Queue("agents"), Queue("webhooks"), Queue("heartbeat"))
app.conf.task_routes = {
    # Safety nets run on `heartbeat`: a backlog or a missing consumer on `agents` or
    # `webhooks` must not stop the jobs that recover those queues' lost work.
    SWEEP_DISPATCHES_JOB: {"queue": "heartbeat"},
    SWEEP_DELIVERIES_JOB: {"queue": "heartbeat"},
    PURGE_OLD_ROWS_JOB: {"queue": "heartbeat"},
    "tasks.*": {"queue": "agents"},
    "webhooks.*": {"queue": "webhooks"},
    "heartbeat.*": {"queue": "heartbeat"},
}
app.autodiscover_tasks(related_name="jobs")


# A started worker's heap out of the garbage collector's full passes (lib/gc_freeze.py): the
# main process (which runs the jobs of the threads and solo pools) once it is ready, and
# each prefork child once it has forked.
worker_ready.connect(lambda **kwargs: freeze_startup_heap(), weak=False)
worker_process_init.connect(lambda **kwargs: freeze_startup_heap(), weak=False)
