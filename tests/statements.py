"""Which SQL statements a block of code ran on Django's connection: the ORM's and the task and
outbox stores' prepared ones alike (a2a_platform.lib.sql.run_prepared honours Django's execute
wrappers)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from django.db import connection

# A lock on a task row: the PostgreSQL store's (`FOR UPDATE OF t`) or the ORM's.
_TASK_LOCK = re.compile(r'FOR UPDATE OF (t\b|"tasks_task")')


@contextlib.contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL of every statement run on the connection meanwhile, in order."""
    ran: list[str] = []

    def record(execute, sql, params, many, context):
        ran.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield ran


def task_locks(ran: list[str]) -> int:
    """How many of `ran` locked a task row."""
    return sum(bool(_TASK_LOCK.search(sql)) for sql in ran)
