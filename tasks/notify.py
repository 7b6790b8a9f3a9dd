"""Transactional wake-ups for the event hub.

PostgreSQL queues NOTIFY until COMMIT, drops it on rollback, and folds identical notifications
(same channel and payload) sent in one transaction into one. The payload is the task id only,
so however many events a transaction appends to a task, listeners get one wake-up per task at
commit and then read every event after their `(task_id, seq)` cursor. SQLite has no NOTIFY;
the hub polls there.
"""

from __future__ import annotations

from django.db import connection

CHANNEL = "a2a_task_events"


def notify_task_event(task_id: object) -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(task_id)])
