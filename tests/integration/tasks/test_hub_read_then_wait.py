"""EventHub.read_then_wait, blocking SendMessage's wait: subscribe, read once, then wait.

Real PostgreSQL LISTEN/NOTIFY; events committed by other threads through the services.
"""

from __future__ import annotations

import asyncio

import pytest
from django.db import connection

from a2a_platform.lib.orm import run_orm
from tasks import selectors, services
from tasks.event_hub import EventHub
from tasks.states import TaskState
from tests.factories import task_create, user_message
from tests.integration.tasks.test_event_hub import in_thread, progress, run, until, waiting_count

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def task(agent):
    return task_create(agent=agent, owner="o", message=user_message("a"))


def last_seq_of(task):
    def read() -> int | None:
        try:
            return selectors.last_seq(task.id)
        finally:
            connection.close()

    return lambda: run_orm(read)


def test_enough_returns_the_value_read_without_waiting(task):
    async def scenario(hub: EventHub) -> int | None:
        return await hub.read_then_wait(
            task.id, last_seq_of(task), enough=lambda seq: seq == 1, timeout=600
        )

    assert run(scenario) == 1


def test_a_commit_after_the_read_wakes_the_waiter(task):
    async def scenario(hub: EventHub) -> None:
        waiter = asyncio.create_task(
            hub.read_then_wait(task.id, last_seq_of(task), enough=lambda _: False, timeout=600)
        )
        await until(lambda: waiting_count(hub, task.id) == 1)
        await asyncio.sleep(0.3)  # past its read: only a NOTIFY can wake it now
        assert not waiter.done()
        await in_thread(progress(task.id))
        assert await asyncio.wait_for(waiter, 60) == 1  # the value it read before the wake
        assert waiting_count(hub, task.id) == 0

    run(scenario)


def test_an_event_committed_during_the_read_is_not_missed(task):
    """The read itself races a commit: its NOTIFY arrives after the subscription."""

    def read_racing_a_commit() -> int | None:
        try:
            seq = selectors.last_seq(task.id)
            services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
            return seq
        finally:
            connection.close()

    async def scenario(hub: EventHub) -> int | None:
        return await asyncio.wait_for(
            hub.read_then_wait(
                task.id, lambda: run_orm(read_racing_a_commit), enough=lambda _: False, timeout=600
            ),
            60,
        )

    assert run(scenario) == 1


def test_it_times_out_with_the_value_read_and_unsubscribes(task):
    async def scenario(hub: EventHub) -> None:
        value = await hub.read_then_wait(
            task.id, last_seq_of(task), enough=lambda _: False, timeout=0.3
        )
        assert value == 1
        assert waiting_count(hub, task.id) == 0

    run(scenario)
