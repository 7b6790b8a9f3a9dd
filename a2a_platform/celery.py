"""The Celery app. Jobs live in each app's jobs.py ("task" always means the A2A Task)."""

import logging
import os
from functools import cached_property

from celery import Celery
from celery.signals import worker_process_init, worker_ready
from kombu import Queue

# Leaf modules (no Django import): safe before the apps load.
from a2a_platform.lib.gc_freeze import freeze_startup_heap
from tasks.job_names import SWEEP_DISPATCHES_JOB
from webhooks.job_names import PURGE_OLD_ROWS_JOB, SWEEP_DELIVERIES_JOB

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")


def _json_ready(program: type) -> type:
    """Celery's worker or beat program (`celery worker`, `celery beat`) that, when
    A2A_LOG_FORMAT=json, configures the platform's logging before it warns or prints anything
    (the Django setup that would do it comes later: a root worker's SecurityWarning is
    earlier) and leaves out its start-up banner (ASCII art and configuration printed to
    stdout, not logged), as `celery --quiet` does: every line the process writes is then a
    JSON object (docs/observability.md, "Logs")."""

    class Program(program):
        def __init__(self, *args, quiet: bool = False, **kwargs) -> None:
            from django.conf import settings

            if settings.A2A_LOG_FORMAT == "json":
                from celery.apps import worker
                from django.utils.log import configure_logging

                configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
                quiet = True
                # The worker writes its shutdown notices ("worker: Warm shutdown") straight
                # to the stdout file descriptor with this function, not through logging.
                if hasattr(worker, "safe_say"):
                    worker.safe_say = _say_as_log
            super().__init__(*args, quiet=quiet, **kwargs)

    return Program


def _say_as_log(msg: str, f: object = None) -> None:
    """celery.apps.worker.safe_say in json mode: the notice as a log record."""
    logging.getLogger("celery.apps.worker").info(msg.strip())


class PlatformCelery(Celery):
    # Imported when a worker or beat starts, not by every process that imports the app.
    @cached_property
    def Worker(self):
        from celery.apps.worker import Worker

        return self.subclass_with_self(_json_ready(Worker))

    @cached_property
    def Beat(self):
        from celery.apps.beat import Beat

        return self.subclass_with_self(_json_ready(Beat))


app = PlatformCelery("a2a_platform")
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
