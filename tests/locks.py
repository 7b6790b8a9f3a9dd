"""Races made deterministic on PostgreSQL: a write held open in a thread of its own (its
transaction not yet committed), and a wait until another connection queues on its locks."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from django.db import connection, connections, transaction


@contextlib.contextmanager
def held_open(write: Callable[[], object]) -> Iterator[list[object]]:
    """Run `write` in a transaction in its own thread and hold that transaction open (its
    locks held, nothing committed) until the block ends; then commit it. Yields a list that
    gets `write`'s result, or the exception it raised."""
    done: list[object] = []
    ready, release = threading.Event(), threading.Event()

    def run() -> None:
        try:
            with transaction.atomic():
                done.append(write())
                ready.set()
                release.wait(timeout=30)
        except Exception as exc:
            done.append(exc)
        finally:
            ready.set()
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert ready.wait(timeout=30), "the held write did not run"
    try:
        yield done
    finally:
        release.set()
        thread.join(timeout=30)
    assert not thread.is_alive(), "the held write did not finish"


def wait_for_a_lock_waiter(timeout: float = 10.0) -> None:
    """Return once another connection to this database waits for a lock (a write queued
    behind `held_open`'s); AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError(f"no connection waited for a lock within {timeout} s")


def in_thread(call: Callable[[], object]) -> Callable[[], object]:
    """Start `call` in its own thread (its own connection); returns a function that waits for
    it and gives its result, or the exception it raised."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:
            out.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()

    def result() -> object:
        thread.join(timeout=30)
        assert not thread.is_alive(), "the call did not finish"
        return out[0]

    return result
