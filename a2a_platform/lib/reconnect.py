"""Riding out a database blip (a PostgreSQL restart, a fail-over): which errors mean "the
database is unreachable", and one bounded retry on a fresh connection for writes that must
not be given up at the first refusal (a finished webhook send's record, an executor's
release of its dispatch)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Long enough for a restart (a fast shutdown and start take 2-3 s) and a pool's reconnect
# backoff; short enough that a real outage is given up on and left to the leases and sweepers.
RETRY_BUDGET_SECONDS = 10.0
FIRST_DELAY_SECONDS = 0.1
MAX_DELAY_SECONDS = 2.0


# SQLSTATE classes of a connection that is gone or refused: 08 connection exception, 57P
# operator intervention (57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now).
_UNREACHABLE_SQLSTATES = ("08", "57P")


def database_unreachable(exc: BaseException) -> bool:
    """The database could not be reached or dropped the connection: a connection lost
    mid-query or refused at connect (psycopg's OperationalError without a server answer), an
    AdminShutdown or other SQLSTATE 08/57P error, the pool's PoolTimeout, or an
    InterfaceError (a connection already closed); raised by psycopg or wrapped by Django.
    Not: errors the server answered about a query (a statement timeout, a lock timeout, a
    deadlock), which a fresh connection would not cure."""
    if isinstance(exc, OperationalError | InterfaceError) and exc.__cause__ is not None:
        exc = exc.__cause__  # Django's wrapper: psycopg's error is its cause
    if isinstance(exc, InterfaceError | psycopg.InterfaceError):
        return True
    if not isinstance(exc, OperationalError | psycopg.OperationalError):
        return False
    sqlstate = getattr(exc, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(_UNREACHABLE_SQLSTATES)


def fresh_connection(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Drop this thread's connection: the next query takes a new one (Django's psycopg pool
    discards a broken connection when it comes back, and checks the one it lends)."""
    with contextlib.suppress(Exception):
        connections[alias].close()


def with_reconnect(
    fn: Callable[[], T],
    *,
    what: str,
    budget: float = RETRY_BUDGET_SECONDS,
    extra: dict | None = None,
) -> T:
    """`fn()`, tried again on a fresh connection, with a short doubling backoff, while the
    database is unreachable and `budget` seconds have not passed; then its error is raised.

    `fn` must be one whole transaction (safe to run again: the callers' writes check the row
    they update first), and this must not be called inside an atomic block."""
    deadline = time.monotonic() + budget
    delay = FIRST_DELAY_SECONDS
    tries = 1
    while True:
        try:
            return fn()
        except Exception as exc:
            if (
                not database_unreachable(exc)
                or connections[DEFAULT_DB_ALIAS].in_atomic_block
                or time.monotonic() + delay > deadline
            ):
                raise
            logger.warning(
                "database unreachable; trying again on a fresh connection",
                extra={**(extra or {}), "what": what, "tries": tries, "error": repr(exc)[:200]},
            )
        fresh_connection()
        time.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_SECONDS)
        tries += 1
