"""The event hub on PostgreSQL: LISTEN/NOTIFY wake-ups for in-process asyncio waiters.

Events are committed by other threads through the lifecycle services (NOTIFY is sent at
commit), so these tests need real transactions (`transactional_db`). Each scenario runs in
its own event loop with its own hub, which it stops at the end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from a2a_platform.lib import orm
from tasks import services
from tasks.event_hub import EventHub
from tasks.models import Task
from tasks.notify import CHANNEL
from tasks.states import TaskState
from tests import processes
from tests.factories import task_create, user_message

pytestmark = pytest.mark.django_db(transaction=True)


def run(scenario: Callable[[EventHub], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        hub = EventHub()
        assert hub.backend == "postgresql"
        try:
            assert await hub.start(), "the hub did not connect"
            return await scenario(hub)
        finally:
            await hub.stop()

    try:
        return asyncio.run(main())
    finally:
        # The hub's ORM calls run on a2a_platform.lib.orm's threads, which may keep a pooled
        # connection each; give them back (the test database is flushed, later dropped).
        shutdown = getattr(orm, "shutdown", None)
        if shutdown is not None:
            shutdown()


async def in_thread(fn: Callable[[], Any]) -> Any:
    """A blocking ORM call from async code, on a thread that gives its connection back."""

    def call() -> Any:
        try:
            return fn()
        finally:
            connection.close()

    return await asyncio.to_thread(call)


def progress(task_id) -> Callable[[], Any]:
    return lambda: services.task_transition(
        task_id=task_id, to_state=TaskState.WORKING, message="progress"
    )


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


def waiting_count(hub: EventHub, task_id) -> int:
    return len(hub._waiters.get(str(task_id), ()))


def backends(*, query: str | None = None) -> list[tuple[int, str, str]]:
    """(pid, state, query) of the other sessions on the test database."""
    sql = (
        "SELECT pid, coalesce(state, ''), coalesce(query, '') FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    with psycopg.connect(processes.test_database_url(), autocommit=True) as conn:
        rows = conn.execute(sql).fetchall()
    return [r for r in rows if query is None or r[2] == query]


@pytest.fixture
def tasks_ab(agent):
    a = task_create(agent=agent, owner="o", message=user_message("a"))
    b = task_create(agent=agent, owner="o", message=user_message("b"))
    return a, b


def test_event_hub_wakes_waiter_when_another_thread_commits(tasks_ab):
    task, _ = tasks_ab

    async def scenario(hub: EventHub) -> None:
        waiter = asyncio.create_task(hub.wait_for_task_event(task.id, after_seq=1, timeout=10))
        await until(lambda: waiting_count(hub, task.id) == 1)
        await asyncio.sleep(0.3)  # past its snapshot: only a NOTIFY can wake it now
        assert not waiter.done()
        before = hub.notifications
        started = time.monotonic()
        await in_thread(progress(task.id))
        assert await asyncio.wait_for(waiter, 5) is True
        assert time.monotonic() - started < 2
        assert hub.notifications == before + 1
        assert waiting_count(hub, task.id) == 0

    run(scenario)


def test_event_hub_returns_false_on_timeout(tasks_ab):
    task, _ = tasks_ab

    async def scenario(hub: EventHub) -> None:
        started = time.monotonic()
        assert await hub.wait_for_task_event(task.id, after_seq=1, timeout=0.4) is False
        assert time.monotonic() - started >= 0.4
        assert waiting_count(hub, task.id) == 0  # unsubscribed on the way out

    run(scenario)


def test_event_hub_returns_at_once_for_an_event_already_committed(tasks_ab):
    task, _ = tasks_ab
    services.task_transition(task_id=task.id, to_state=TaskState.WORKING)  # seq 2

    async def scenario(hub: EventHub) -> None:
        started = time.monotonic()
        assert await hub.wait_for_task_event(task.id, after_seq=1, timeout=10) is True
        assert time.monotonic() - started < 2
        # With the cursor at the newest event it waits (and here times out).
        assert await hub.wait_for_task_event(task.id, after_seq=2, timeout=0.2) is False

    run(scenario)


def test_event_hub_sees_an_event_committed_right_after_its_snapshot(tasks_ab, monkeypatch):
    """Subscribe, then snapshot: an event landing just after the snapshot still wakes it."""
    from tasks import selectors

    task, _ = tasks_ab
    real_last_seq = selectors.last_seq

    def snapshot_then_commit(task_id):
        seen = real_last_seq(task_id)
        progress(task_id)()  # commits seq 2 (and its NOTIFY) after the read
        return seen

    monkeypatch.setattr(selectors, "last_seq", snapshot_then_commit)

    async def scenario(hub: EventHub) -> None:
        started = time.monotonic()
        assert await hub.wait_for_task_event(task.id, after_seq=1, timeout=5) is True
        assert time.monotonic() - started < 2

    run(scenario)
    assert Task.objects.get(pk=task.id).last_seq == 2


def test_event_hub_waiter_is_not_woken_by_another_task(tasks_ab):
    task_a, task_b = tasks_ab

    async def scenario(hub: EventHub) -> None:
        waiter_a = asyncio.create_task(hub.wait_for_task_event(task_a.id, after_seq=1, timeout=1.0))
        waiter_b = asyncio.create_task(hub.wait_for_task_event(task_b.id, after_seq=1, timeout=5))
        await until(lambda: waiting_count(hub, task_a.id) == waiting_count(hub, task_b.id) == 1)
        await asyncio.sleep(0.2)
        await in_thread(progress(task_b.id))
        assert await asyncio.wait_for(waiter_b, 5) is True
        assert not waiter_a.done()
        assert await waiter_a is False

    run(scenario)


def test_event_hub_many_waiters_wake_and_hold_no_connection(tasks_ab):
    task, _ = tasks_ab
    waiters_n = 200
    connection.close()
    baseline = len(backends())
    pool_max = settings.DATABASES["default"].get("OPTIONS", {}).get("pool", {}).get("max_size", 0)
    orm_threads = getattr(settings, "A2A_ORM_THREADS", pool_max)
    # The LISTEN connection, one per ORM thread at most, a small slack.
    allowed = 1 + min(pool_max, orm_threads) + 2
    assert waiters_n > 5 * allowed

    async def scenario(hub: EventHub) -> None:
        waiters = [
            asyncio.create_task(hub.wait_for_task_event(task.id, after_seq=1, timeout=20))
            for _ in range(waiters_n)
        ]
        await until(lambda: waiting_count(hub, task.id) == waiters_n, timeout=15)
        await asyncio.sleep(0.3)
        sessions = await asyncio.to_thread(backends)
        assert len(sessions) - baseline <= allowed, sessions
        assert not [s for s in sessions if s[1].startswith("idle in transaction")]
        assert [s for s in sessions if s[2] == f"LISTEN {CHANNEL}"]
        assert not any(w.done() for w in waiters)
        await in_thread(progress(task.id))
        results = await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert results == [True] * waiters_n
        assert waiting_count(hub, task.id) == 0

    run(scenario)


def test_event_hub_reconnects_after_its_connection_is_terminated(tasks_ab):
    task, _ = tasks_ab
    listen_query = f"LISTEN {CHANNEL}"

    def terminate(pid: int) -> None:
        with psycopg.connect(processes.test_database_url(), autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])

    async def scenario(hub: EventHub) -> None:
        listeners = await asyncio.to_thread(backends, query=listen_query)
        assert len(listeners) == 1
        old_pid = listeners[0][0]

        stranded = asyncio.create_task(hub.wait_for_task_event(task.id, after_seq=1, timeout=20))
        await until(lambda: waiting_count(hub, task.id) == 1)
        await asyncio.sleep(0.2)
        await asyncio.to_thread(terminate, old_pid)
        # A wake-up may have been missed while disconnected: the waiter re-reads (spurious).
        assert await asyncio.wait_for(stranded, 5) is True

        await until(lambda: hub.connected, timeout=10)
        listeners = await asyncio.to_thread(backends, query=listen_query)
        assert [pid for pid, _, _ in listeners if pid != old_pid]

        waiter = asyncio.create_task(hub.wait_for_task_event(task.id, after_seq=1, timeout=10))
        await until(lambda: waiting_count(hub, task.id) == 1)
        await asyncio.sleep(0.3)
        assert not waiter.done()
        before = hub.notifications
        await in_thread(progress(task.id))
        assert await asyncio.wait_for(waiter, 5) is True
        assert hub.notifications == before + 1

    run(scenario)


def test_event_hub_connects_as_django_does_through_database_options(tasks_ab, monkeypatch):
    """A DATABASE_URL may name its server through OPTIONS only (`?host=/run/postgresql`, a
    socket directory; `?sslmode=…`): the hub's LISTEN connection uses them as Django's own
    connections do. PGHOST points elsewhere, so a hub that dropped OPTIONS would connect over
    TCP (or not at all) and the check on its session below would fail."""
    task, _ = tasks_ab
    with psycopg.connect(processes.test_database_url(), autocommit=True) as conn:
        socket_dir = conn.execute("SHOW unix_socket_directories").fetchone()[0].split(",")[0]
        port = conn.execute("SHOW port").fetchone()[0]
    name = "hub-through-options"
    db = connection.settings_dict
    monkeypatch.setitem(db, "HOST", "")
    monkeypatch.setitem(db, "PORT", "")
    monkeypatch.setitem(
        db,
        "OPTIONS",
        {**db["OPTIONS"], "host": socket_dir.strip(), "port": port, "application_name": name},
    )
    monkeypatch.setenv("PGHOST", "127.0.0.1")

    def hub_session() -> list[tuple]:
        with psycopg.connect(processes.test_database_url(), autocommit=True) as conn:
            return conn.execute(
                "SELECT client_addr, query FROM pg_stat_activity WHERE application_name = %s",
                [name],
            ).fetchall()

    async def scenario(hub: EventHub) -> None:
        assert await asyncio.to_thread(hub_session) == [(None, f"LISTEN {CHANNEL}")]
        waiter = asyncio.create_task(hub.wait_for_task_event(task.id, after_seq=1, timeout=10))
        await until(lambda: waiting_count(hub, task.id) == 1)
        await in_thread(progress(task.id))
        assert await asyncio.wait_for(waiter, 5) is True

    run(scenario)
