"""The lifecycle's hot statements, for PostgreSQL and for the embedded database.

tasks/services.py decides (the state machine, the artifact chunk rules, what the event says);
this package only reads and writes the rows, inside the caller's transaction (the few calls
documented as atomic on their own may also run outside one: one statement on PostgreSQL
commits as it returns, without BEGIN and COMMIT round trips). As Django's database backends
implement one set of operations per vendor, one concern per module:

- base.py: `TaskStore`, the interface, one docstring per method, and its types;
- postgres.py: `PgTaskStore`, what production runs, each step one prepared statement;
- sql.py: the task rows' statements `PgTaskStore` prepares, generated from the models' `_meta`;
- claims.py: its executor dispatch claim and release statements;
- orm.py: `OrmTaskStore`, the same through the ORM, on any database.

`get_task_store()` is the one switch (`settings.A2A_STORE`). tests/integration/tasks/
test_task_store.py holds the two to one contract; test_services.py runs the services through
both.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from tasks.task_store.base import (
    LIFECYCLE_FIELDS,
    DispatchClaimRow,
    DispatchRelease,
    EventsWrite,
    NewTask,
    SettledKey,
    Snapshot,
    SnapshotKey,
    TaskStore,
)
from tasks.task_store.orm import OrmTaskStore
from tasks.task_store.postgres import PgTaskStore

__all__ = [
    "LIFECYCLE_FIELDS",
    "DispatchClaimRow",
    "DispatchRelease",
    "EventsWrite",
    "NewTask",
    "OrmTaskStore",
    "PgTaskStore",
    "SettledKey",
    "Snapshot",
    "SnapshotKey",
    "TaskStore",
    "get_task_store",
]

_PG = PgTaskStore()
_ORM = OrmTaskStore()


def get_task_store() -> TaskStore:
    """The task store `settings.A2A_STORE` chooses: "auto" the prepared SQL on PostgreSQL and
    the ORM elsewhere, "orm" the ORM everywhere, "postgres" the SQL (ImproperlyConfigured on
    another database)."""
    choice = settings.A2A_STORE
    if choice == "auto":
        return _PG if connection.vendor == "postgresql" else _ORM
    if choice == "orm":
        return _ORM
    if choice == "postgres":
        if connection.vendor != "postgresql":
            raise ImproperlyConfigured(
                f"A2A_STORE=postgres needs PostgreSQL; the database is {connection.vendor}"
            )
        return _PG
    raise ImproperlyConfigured(f"A2A_STORE must be auto, orm or postgres, not {choice!r}")
