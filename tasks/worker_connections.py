"""Database connections in Celery worker processes, handled as Django handles them per request.

Celery's Django fixup closes every connection before and after each job and, with a
connection pool under the prefork pool, closes the pool itself: each job then opened new
PostgreSQL connections (a server process forked, authentication, the pool's checks). With
`CELERY_DB_REUSE_MAX` set (settings), the fixup leaves them be, and these handlers do what
Django does at each request's start and end instead: `close_old_connections()` hands a
connection back to the pool and drops one that errored or is no longer usable (a PostgreSQL
restart), so the next job gets a healthy one. A forked child still closes what it inherited
(the fixup's `worker_process_init`, unaffected by the setting).
"""

from __future__ import annotations

from celery.signals import task_postrun, task_prerun
from django.db import close_old_connections


@task_prerun.connect(weak=False)
def _connections_before_job(**kwargs) -> None:
    close_old_connections()


@task_postrun.connect(weak=False)
def _connections_after_job(**kwargs) -> None:
    close_old_connections()
