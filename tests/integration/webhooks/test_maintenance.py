"""The sweeper's vacuum of the delivery queue's tables (webhooks/delivery/maintenance.py), on the
real PostgreSQL: dead row versions pile up with every claim and record, and the claim's index
scans pay for each until a vacuum."""

from __future__ import annotations

import contextlib
import time

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from tests.factories import AgentFactory
from tests.webhook_checks import configure, open_task
from webhooks.delivery.maintenance import QUEUE_TABLES, vacuum_queue_tables
from webhooks.jobs import sweep_deliveries_job
from webhooks.models import PushConfig

pytestmark = pytest.mark.django_db(transaction=True)  # VACUUM cannot run in a transaction

TABLE = "webhooks_pushconfig"
HOOK = "http://127.0.0.1:9/hook"


@pytest.fixture
def config(settings):
    # Every pooled backend of this process ends here, and a fresh one serves the test. Each
    # backend keeps its table counters pending until it flushes them, which under load may be
    # seconds later; the TRUNCATE of an earlier test's flush, pending on one of them, zeroed
    # the table's dead-row count if it landed in the middle of this test (the likely cause of
    # a CI run that read 0 of 1,200 under load). A backend flushes what it holds when it exits.
    connection.close()
    connection.close_pool()
    configure(settings)
    _, (push,) = open_task(AgentFactory(executor="external"), "hi", {"id": "a", "url": HOOK})
    # The server's autovacuum must not run here: an autoanalyze triggered by the churn
    # replaces the table's dead-row count with its sample's estimate (one full run saw 49 of
    # 1,200), and an autovacuum would do the sweeper's work. Only the sweeper vacuums.
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
    yield push
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)")


def table_stats() -> tuple[int, int]:
    """(dead row versions, manual vacuums so far) of the config table, this backend's counts
    flushed first."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relname = %s", [TABLE]
        )
        return cursor.fetchone()


@contextlib.contextmanager
def old_snapshot():
    """Another session's open REPEATABLE READ snapshot: while it lives, no dead version is
    pruned on access (which would make the dead-row counts depend on page fill)."""
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"],
        user=db["USER"],
        host=db["HOST"],
        port=db["PORT"] or 5432,
        autocommit=True,
    ) as other:
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held = other.execute(
            "SELECT backend_xmin FROM pg_stat_activity WHERE pid = pg_backend_pid()"
        ).fetchone()[0]
        assert held is not None  # the snapshot holds back the pruning horizon
        yield
        other.execute("ROLLBACK")


def churn(push: PushConfig, times: int) -> None:
    """What claims and records do to a config row: rewrite its head time, one version each."""
    with old_snapshot():
        for _ in range(times):
            PushConfig.objects.filter(pk=push.pk).update(head_due_at=timezone.now())
        # PostgreSQL 15 flushes a backend's table counters asynchronously (at most once a
        # second, at its next idle moment): wait for the count, while the snapshot holds them.
        deadline = time.monotonic() + 10
        dead = table_stats()[0]
        while dead < times and time.monotonic() < deadline:
            time.sleep(0.2)
            dead = table_stats()[0]
    state = connection.connection.info.transaction_status if connection.connection else None
    assert dead >= times, (dead, connection.in_atomic_block, connection.get_autocommit(), state)


def test_the_sweeper_vacuums_a_config_table_full_of_dead_rows(config):
    churn(config, QUEUE_TABLES[TABLE] + 200)
    dead, vacuums = table_stats()
    assert dead > QUEUE_TABLES[TABLE]

    sweep_deliveries_job()

    dead, vacuums_after = table_stats()
    assert vacuums_after == vacuums + 1
    assert dead < 50


def test_a_table_below_its_threshold_is_left_alone(config):
    vacuum_queue_tables()  # whatever earlier tests left behind
    churn(config, 20)
    vacuums = table_stats()[1]
    assert vacuum_queue_tables() == []
    dead, vacuums_after = table_stats()
    assert dead >= 20
    assert vacuums_after == vacuums


def test_operators_can_leave_vacuuming_to_their_own_schedule(config, settings):
    settings.A2A_WEBHOOK_VACUUM_QUEUE_TABLES = False
    churn(config, QUEUE_TABLES[TABLE] + 200)
    dead, vacuums = table_stats()
    assert vacuum_queue_tables() == []
    dead_after, vacuums_after = table_stats()
    assert vacuums_after == vacuums  # no vacuum ran
    # and none removed the dead rows (their count only grows while PostgreSQL 15 flushes
    # late table counters: one CI run under load saw it rise between the two reads)
    assert dead_after >= dead
