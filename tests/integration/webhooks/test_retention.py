"""Retention (webhooks/delivery/retention.py): one run purges every eligible row,
`A2A_RETENTION_BATCH` rows per statement, and leaves the rest.

Eligible: deliveries delivered or canceled before the cutoff (with their attempts) and the
events of finished tasks created before it. Not eligible: dead-lettered deliveries (an
operator acts on them), open ones, recent ones, and every event of a live task.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tasks import services
from tasks.models import Task, TaskEvent
from tasks.states import TaskState
from tests.factories import AgentFactory
from tests.webhook_checks import configure, open_task
from webhooks.delivery.retention import Purged, purge_old_rows
from webhooks.models import Delivery, DeliveryAttempt, DeliveryState, PushConfig

pytestmark = pytest.mark.django_db

URL = "http://127.0.0.1:9/hook"


@pytest.fixture(autouse=True)
def _retention(settings):
    configure(settings)
    settings.A2A_RETENTION_DAYS = 14


def finished_task_with_config() -> tuple[Task, PushConfig]:
    agent = AgentFactory(executor="external")
    task, (config,) = open_task(agent, "x", {"url": URL})
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    return task, config


def add_deliveries(config: PushConfig, count: int, state: str, finished_at, attempts=0) -> set:
    """`count` deliveries of `config` in `state`, finished at `finished_at`, with `attempts`
    attempt rows each; returns their pks."""
    binding = config.bindings.get()
    rows = Delivery.objects.bulk_create(
        Delivery(
            config=config,
            binding=binding,
            task_id=config.task_id,
            seq=1,
            kind="status",
            body="{}",
            state=state,
            attempts=attempts,
            next_attempt_at=finished_at,
            finished_at=finished_at if state != DeliveryState.PENDING else None,
        )
        for _ in range(count)
    )
    DeliveryAttempt.objects.bulk_create(
        DeliveryAttempt(
            delivery=row,
            number=n,
            url=URL,
            started_at=finished_at,
            status=200,
            request_headers={"Authorization": "<redacted>"},
        )
        for row in rows
        for n in range(1, attempts + 1)
    )
    return {row.pk for row in rows}


def add_events(task: Task, count: int, created_at) -> set:
    """`count` status events of `task` created at `created_at` (after its real ones)."""
    first = task.events.order_by("-seq").values_list("seq", flat=True).first() or 0
    rows = TaskEvent.objects.bulk_create(
        TaskEvent(task=task, seq=first + 1 + i, kind="status", payload={}, created_at=created_at)
        for i in range(count)
    )
    return {row.pk for row in rows}


def deletes_of(queries, table: str) -> list[int]:
    """How many primary keys each captured `DELETE FROM <table> ... IN (...)` named."""
    sizes = []
    for query in queries:
        sql = query["sql"]
        if sql.startswith(f'DELETE FROM "{table}"'):
            match = re.search(r" IN \(([^)]*)\)", sql)
            assert match, sql
            sizes.append(len(match.group(1).split(",")))
    return sizes


def test_purge_deletes_more_rows_than_the_batch_in_one_run_batch_by_batch(settings):
    settings.A2A_RETENTION_BATCH = 3
    now = timezone.now()
    old, recent = now - timedelta(days=20), now - timedelta(days=1)
    finished, config = finished_task_with_config()
    live = open_task(AgentFactory(executor="external"), "x", {"url": URL})[0]
    services.task_transition(task_id=live.pk, to_state=TaskState.WORKING)

    eligible = add_deliveries(config, 8, DeliveryState.DELIVERED, old, attempts=2)
    eligible |= add_deliveries(config, 3, DeliveryState.CANCELED, old, attempts=1)
    add_deliveries(config, 2, DeliveryState.DEAD, old, attempts=3)  # an operator acts on them
    add_deliveries(config, 2, DeliveryState.DELIVERED, recent, attempts=1)
    add_deliveries(config, 2, DeliveryState.PENDING, old)
    old_events = add_events(finished, 10, old)
    add_events(live, 5, old)  # a live task keeps every event (streams resume from them)
    # Kept: everything else (with the tasks' own deliveries and events, all recent or open).
    kept = set(Delivery.objects.exclude(pk__in=eligible).values_list("pk", flat=True))
    kept_attempts = set(
        DeliveryAttempt.objects.filter(delivery_id__in=kept).values_list("pk", flat=True)
    )
    kept_events = set(TaskEvent.objects.exclude(pk__in=old_events).values_list("pk", flat=True))
    assert len(eligible) > 3 * settings.A2A_RETENTION_BATCH

    with CaptureQueriesContext(connection) as captured:
        purged = purge_old_rows()

    assert purged == Purged(deliveries=11, events=10)
    assert set(Delivery.objects.values_list("pk", flat=True)) == kept
    assert set(DeliveryAttempt.objects.values_list("pk", flat=True)) == kept_attempts
    assert set(TaskEvent.objects.values_list("pk", flat=True)) == kept_events
    # Batch by batch: no statement deletes more than the batch, and together they took all.
    deliveries_deleted = deletes_of(captured, "webhooks_delivery")
    events_deleted = deletes_of(captured, "tasks_taskevent")
    assert max(deliveries_deleted + events_deleted) <= 3
    assert sum(deliveries_deleted) == 11
    assert len(deliveries_deleted) == math.ceil(11 / 3)
    assert sum(events_deleted) == 10
    assert len(events_deleted) == math.ceil(10 / 3)
    assert purge_old_rows() == Purged(0, 0)


def test_purge_catches_up_with_a_backlog_of_hundreds_of_batches_in_one_run(settings):
    """A backlog many times the batch (a table growing faster than a fixed number of batches
    per hourly run could keep up with) is purged in one run, not left to grow."""
    settings.A2A_RETENTION_BATCH = 2
    old = timezone.now() - timedelta(days=20)
    finished, config = finished_task_with_config()
    before_deliveries = Delivery.objects.count()
    eligible = add_deliveries(config, 300, DeliveryState.DELIVERED, old, attempts=1)
    add_events(finished, 300, old)
    before_events = TaskEvent.objects.count()

    purged = purge_old_rows()

    assert purged == Purged(deliveries=300, events=300)
    assert not Delivery.objects.filter(pk__in=eligible).exists()
    assert Delivery.objects.count() == before_deliveries
    assert not DeliveryAttempt.objects.exists()
    assert TaskEvent.objects.count() == before_events - 300
