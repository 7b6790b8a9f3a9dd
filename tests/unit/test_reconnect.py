"""Which database errors mean "unreachable", and the bounded retry on a fresh connection
(a2a_platform/lib/reconnect.py). The real outage is tests/fault/*/test_postgres_*.py."""

from __future__ import annotations

import psycopg
import pytest
from django.db import InterfaceError, OperationalError
from psycopg import errors
from psycopg_pool import PoolTimeout

from a2a_platform.lib import reconnect
from a2a_platform.lib.reconnect import database_unreachable, with_reconnect


def wrapped(cause: Exception) -> OperationalError:
    """As Django raises it: its OperationalError, psycopg's error as the cause."""
    exc = OperationalError(str(cause))
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    ("exc", "unreachable"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (errors.AdminShutdown("terminating connection due to administrator command"), True),
        (errors.CannotConnectNow("the database system is starting up"), True),
        (PoolTimeout("couldn't get a connection after 10.00 sec"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (InterfaceError("connection already closed"), True),
        (wrapped(errors.AdminShutdown("terminating connection")), True),
        (wrapped(PoolTimeout("couldn't get a connection")), True),
        # Answered by the server about the query: a fresh connection would not cure it.
        (errors.QueryCanceled("canceling statement due to statement timeout"), False),
        (errors.LockNotAvailable("could not obtain lock"), False),
        (errors.DeadlockDetected("deadlock detected"), False),
        (wrapped(errors.QueryCanceled("canceling statement")), False),
        (psycopg.IntegrityError("duplicate key"), False),
        (ValueError("not a database error"), False),
    ],
)
def test_database_unreachable_classifies(exc, unreachable):
    assert database_unreachable(exc) is unreachable


def flaky(failures: list[Exception], result: str = "done"):
    calls = []

    def fn() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return result

    return fn, calls


class Clock:
    """reconnect's `time`: sleeping moves it on, nothing else does."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(reconnect, "time", fake)
    return fake


def test_with_reconnect_tries_again_while_unreachable(clock):
    fn, calls = flaky([errors.AdminShutdown("x"), PoolTimeout("y")])
    assert with_reconnect(fn, what="test") == "done"
    assert len(calls) == 3
    assert clock.slept == [0.1, 0.2]


def test_with_reconnect_raises_other_errors_at_once(clock):
    fn, calls = flaky([errors.QueryCanceled("statement timeout")])
    with pytest.raises(errors.QueryCanceled):
        with_reconnect(fn, what="test")
    assert len(calls) == 1
    assert clock.slept == []


def test_with_reconnect_gives_up_after_its_budget(clock):
    fn, calls = flaky([psycopg.OperationalError("down")] * 100)
    with pytest.raises(psycopg.OperationalError):
        with_reconnect(fn, what="test")
    # A doubling backoff capped at 2 s, while the next wait still ends within the 10 s budget.
    assert clock.slept == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert len(calls) == len(clock.slept) + 1
