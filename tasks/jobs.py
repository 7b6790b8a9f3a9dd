"""Celery jobs of the tasks app (thin: ids in, one service call)."""

from __future__ import annotations

import socket

from celery import shared_task
from django.conf import settings

# Imported for its signal handlers: worker processes reuse pooled connections per job.
from tasks import worker_connections  # noqa: F401
from tasks.executors.runner import run_dispatch, run_due
from tasks.job_names import (
    RUN_DUE_DISPATCHES_JOB,
    RUN_DUE_HOSTED_JOB,
    RUN_EXECUTOR_JOB,
    SWEEP_DISPATCHES_JOB,
)
from tasks.sweeper import dispatch_sweep


@shared_task(name=RUN_EXECUTOR_JOB, bind=True)
def run_executor_job(self, dispatch_id: int, hosted: bool = False) -> str:
    worker = f"{self.request.hostname or socket.gethostname()}:{self.request.id}"
    if hosted:
        # The a2a-sdk server modules are imported where a hosted executor runs, not before.
        from tasks.executors.host import host

        return host().take(dispatch_id=dispatch_id, worker=worker)
    return run_dispatch(dispatch_id=dispatch_id, worker=worker)


@shared_task(name=RUN_DUE_DISPATCHES_JOB, bind=True)
def run_due_dispatches_job(self, helper: bool = False) -> int:
    worker = self.request.hostname or socket.gethostname()
    return run_due(
        worker=f"{worker}:{self.request.id}",
        linger=settings.A2A_DISPATCH_DRAIN_LINGER_SECONDS,
        helper=helper,
    )


@shared_task(name=RUN_DUE_HOSTED_JOB, bind=True)
def run_due_hosted_job(self) -> int:
    from tasks.executors.host import host

    worker = self.request.hostname or socket.gethostname()
    return host().drain(
        worker=f"{worker}:{self.request.id}", linger=settings.A2A_DISPATCH_DRAIN_LINGER_SECONDS
    )


@shared_task(name=SWEEP_DISPATCHES_JOB)
def sweep_dispatches_job() -> dict:
    result = dispatch_sweep()
    return {"re_enqueued": result.re_enqueued, "failed_tasks": result.failed_tasks}
