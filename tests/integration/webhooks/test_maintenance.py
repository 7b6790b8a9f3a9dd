"""The sweeper's vacuum of the delivery queue's tables (webhooks/maintenance.py), on the real
PostgreSQL: dead row versions pile up with every claim and record, and the claim's index
scans pay for each until a vacuum."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from tests.factories import AgentFactory
from tests.webhook_checks import configure, open_task
from webhooks.jobs import sweep_deliveries_job
from webhooks.maintenance import QUEUE_TABLES, vacuum_queue_tables
from webhooks.models import PushConfig

pytestmark = pytest.mark.django_db(transaction=True)  # VACUUM cannot run in a transaction

TABLE = "webhooks_pushconfig"
HOOK = "http://127.0.0.1:9/hook"


@pytest.fixture
def config(settings):
    configure(settings)
    _, (push,) = open_task(AgentFactory(executor="external"), "hi", {"id": "a", "url": HOOK})
    return push


def table_stats() -> tuple[int, object]:
    """(dead row versions, last manual vacuum) of the config table, this backend's counts
    flushed first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT n_dead_tup, last_vacuum FROM pg_stat_user_tables WHERE relname = %s", [TABLE]
        )
        return cursor.fetchone()


def churn(push: PushConfig, times: int) -> None:
    """What claims and records do to a config row: rewrite its head time, one version each."""
    for _ in range(times):
        PushConfig.objects.filter(pk=push.pk).update(head_due_at=timezone.now())


def test_the_sweeper_vacuums_a_config_table_full_of_dead_rows(config):
    churn(config, QUEUE_TABLES[TABLE] + 200)
    dead, _ = table_stats()
    assert dead > QUEUE_TABLES[TABLE]

    sweep_deliveries_job()

    dead, vacuumed_at = table_stats()
    assert vacuumed_at is not None
    assert dead < 50


def test_a_table_below_its_threshold_is_left_alone(config):
    vacuum_queue_tables()  # whatever earlier tests left behind
    churn(config, 20)
    assert table_stats()[0] >= 20
    assert vacuum_queue_tables() == []
    assert table_stats()[0] >= 20


def test_operators_can_leave_vacuuming_to_their_own_schedule(config, settings):
    settings.A2A_WEBHOOK_VACUUM_QUEUE_TABLES = False
    churn(config, QUEUE_TABLES[TABLE] + 200)
    assert vacuum_queue_tables() == []
    assert table_stats()[0] > QUEUE_TABLES[TABLE]
