"""Reads of the task store, every one scoped by agent and owner where a caller is involved."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction

from tasks.models import Artifact, Message, Task, TaskEvent
from tasks.task_store import store


def _uuid(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


def task_for_owner(*, agent_id: int, owner: str, task_id: object) -> Task | None:
    """A task visible to `owner` on this agent; None for unknown and foreign ids alike."""
    pk = _uuid(task_id)
    if pk is None:
        return None
    return store().visible(agent_id, owner, pk)


def task_history(task: Task, history_length: int | None) -> list[Message]:
    """The task's messages in order: all of them (None) or the newest `history_length`."""
    return store().history(task, history_length)


def task_artifacts(task: Task) -> list[Artifact]:
    return store().artifacts(task)


def task_for_agent(*, agent_id: int, task_id: object) -> Task | None:
    """A task of this agent whoever owns it (worker backends act for the agent)."""
    pk = _uuid(task_id)
    if pk is None:
        return None
    return Task.objects.filter(pk=pk, agent_id=agent_id).select_related("agent").first()


def events_after(*, task_id: object, after_seq: int, limit: int = 500) -> list[TaskEvent]:
    return list(
        TaskEvent.objects.filter(task_id=task_id, seq__gt=after_seq).order_by("seq")[:limit]
    )


def last_seq(task_id: object) -> int | None:
    return Task.objects.filter(pk=task_id).values_list("last_seq", flat=True).first()


@contextmanager
def consistent_reads() -> Iterator[None]:
    """A read-only transaction whose queries all see one committed state (REPEATABLE READ on
    PostgreSQL; SQLite reads one snapshot per transaction anyway): a task snapshot whose
    history and artifacts agree with its `last_seq`, so a stream resuming after that seq
    neither repeats nor skips an event."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield
