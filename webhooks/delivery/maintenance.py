"""Keeping the delivery queue's tables lean between PostgreSQL's own vacuums.

Every claim and record rewrites the config's `head_due_at` and the delivery's state, so the
small `webhooks_pushconfig` table gathers dead row versions by the thousand per second of
load, and the claim's index scans step over every one of them (bench/delivery_bench.py
measured a claim that found nothing taking 3.6 ms behind 120,000 dead versions of 3,000
configs). Autovacuum wakes at most once a `autovacuum_naptime` (a minute by default), scales
its threshold with the table, and may be off: the sweeper (every 5 s) vacuums a queue table
itself once its dead versions pass a threshold. A plain VACUUM takes no lock that writers
or claimers wait on, and skips pages without dead rows.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)

# Table -> how many dead row versions, beyond a tenth of its live rows, trigger a vacuum.
QUEUE_TABLES = {
    "webhooks_pushconfig": 1_000,
    "webhooks_delivery": 20_000,
    "webhooks_deliveryattempt": 20_000,
}


def vacuum_queue_tables() -> list[str]:
    """VACUUM the queue tables whose dead row versions passed their threshold; returns them.
    PostgreSQL only; must run outside a transaction (VACUUM cannot run inside one)."""
    if connection.vendor != "postgresql" or not settings.A2A_WEBHOOK_VACUUM_QUEUE_TABLES:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, n_dead_tup, n_live_tup FROM pg_stat_user_tables "
            "WHERE schemaname = current_schema() AND relname = ANY(%s)",
            [list(QUEUE_TABLES)],
        )
        due = [
            name for name, dead, live in cursor.fetchall() if dead > QUEUE_TABLES[name] + live // 10
        ]
        for name in due:
            cursor.execute(f"VACUUM {connection.ops.quote_name(name)}")
    if due:
        logger.info("webhook queue tables vacuumed", extra={"tables": due})
    return due
