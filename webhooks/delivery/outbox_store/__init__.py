"""The outbox store: the outbox's hot statements, declared once (`OutboxStore`), twice implemented.

webhooks/services.py and webhooks/delivery/claim_record.py decide (who is owed an event, which
heads go, what an attempt's result means); a store only reads and writes the rows, inside the
caller's transaction. As Django's database backends implement one set of operations per vendor,
one concern per module:

- base.py: `OutboxStore`, the interface, one docstring per statement, and its types;
- postgres.py: `PgOutboxStore`, what production runs, each step one prepared statement
  generated from the models' `_meta`;
- orm.py: `OrmOutboxStore`, the same through the ORM, on any database.

`get_outbox_store()` is the one switch (`settings.A2A_STORE`). tests/integration/webhooks/
test_outbox_store.py holds both to one contract; test_outbox.py runs every service case
through both.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from webhooks.delivery.outbox_store.base import (
    AttemptResult,
    Head,
    NewAttempt,
    OutboxEvent,
    OutboxStore,
    Recorded,
)
from webhooks.delivery.outbox_store.orm import OrmOutboxStore
from webhooks.delivery.outbox_store.postgres import PgOutboxStore

__all__ = [
    "AttemptResult",
    "Head",
    "NewAttempt",
    "OrmOutboxStore",
    "OutboxEvent",
    "OutboxStore",
    "PgOutboxStore",
    "Recorded",
    "get_outbox_store",
]

_PG = PgOutboxStore()
_ORM = OrmOutboxStore()


def get_outbox_store() -> OutboxStore:
    """The store `settings.A2A_STORE` asks for: "auto" = the prepared SQL on PostgreSQL and
    the ORM elsewhere, "orm" = the ORM everywhere, "postgres" = the SQL (refused on another
    database)."""
    choice = settings.A2A_STORE
    on_postgres = connection.vendor == "postgresql"
    if choice == "orm":
        return _ORM
    if choice == "postgres":
        if not on_postgres:
            raise ImproperlyConfigured(
                f"A2A_STORE=postgres needs PostgreSQL, not {connection.vendor}"
            )
        return _PG
    return _PG if on_postgres else _ORM
