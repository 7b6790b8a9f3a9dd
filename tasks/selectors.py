"""Reads of the task store, every one scoped by agent and owner where a caller is involved."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import BooleanField, Case, Count, Q, QuerySet, Value, When
from django.db.models.fields.json import KT

from agents.card_render import PUSH_CHANNEL_URI
from tasks.models import (
    Artifact,
    DispatchState,
    EventKind,
    ExecutorDispatch,
    Message,
    Task,
    TaskEvent,
)
from tasks.states import IN_FLIGHT_VALUES, TaskState
from tasks.task_store import SettledKey, Snapshot, SnapshotKey, get_task_store


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
    return get_task_store().visible(agent_id, owner, pk)


def snapshot_key(
    *, agent_id: int, owner: str, task_id: object, history_length: int | None
) -> SnapshotKey | None:
    """What `task_snapshots_for_owner` reads for one GetTask: the task visible to `owner` on
    this agent, with its newest `history_length` messages (None all, 0 none). None for a
    malformed id (no task has it)."""
    pk = _uuid(task_id)
    if pk is None:
        return None
    return SnapshotKey(agent_id, owner, pk, history_length)


def task_snapshots_for_owner(*, keys: list[SnapshotKey]) -> list[Snapshot | None]:
    """For each key, in order, task_for_owner with its history and artifacts, read together,
    or None for unknown and foreign ids. One statement on PostgreSQL however many keys."""
    return get_task_store().visible_snapshots(keys)


def task_history(task: Task, history_length: int | None) -> list[Message]:
    """The task's messages in order: all of them (None) or the newest `history_length`."""
    return get_task_store().history(task, history_length)


def task_artifacts(task: Task) -> list[Artifact]:
    return get_task_store().artifacts(task)


def task_for_agent(*, agent_id: int, task_id: object) -> Task | None:
    """A task of this agent whoever owns it (worker backends act for the agent)."""
    pk = _uuid(task_id)
    if pk is None:
        return None
    return Task.objects.filter(pk=pk, agent_id=agent_id).select_related("agent").first()


def tasks_in_state(*, agent_id: int, state: str, limit: int = 100) -> list[Task]:
    """An agent's tasks in one state, oldest status first (the worker API's task list)."""
    return list(
        Task.objects.filter(agent_id=agent_id, state=state).order_by("status_timestamp")[:limit]
    )


@dataclass(frozen=True)
class TaskPage:
    tasks: list[Task]
    more: bool  # another page follows the last task
    total: int  # tasks matching the filters, all pages


def task_page(
    *,
    agent_id: int,
    owner: str,
    page_size: int,
    context_id: str = "",
    state: str | None = None,
    status_after: datetime | None = None,
    after_key: tuple[datetime, str] | None = None,
) -> TaskPage:
    """One page of the owner's tasks on this agent, newest status first (ListTasks).

    Keyset paging on (status_timestamp, id), both descending: `after_key` is the last task of
    the previous page, so a page never repeats or skips a task whatever is written meanwhile.
    `total` counts every page.
    """
    qs = Task.objects.filter(agent_id=agent_id, owner=owner)
    if context_id:
        qs = qs.filter(context_id=context_id)
    if state is not None:
        qs = qs.filter(state=state)
    if status_after is not None:
        qs = qs.filter(status_timestamp__gte=status_after)
    total = qs.count()
    if after_key is not None:
        ts, pk = after_key
        qs = qs.filter(Q(status_timestamp__lt=ts) | Q(status_timestamp=ts, pk__lt=pk))
    rows = list(qs.order_by("-status_timestamp", "-pk")[: page_size + 1])
    return TaskPage(rows[:page_size], len(rows) > page_size, total)


def task_settled_snapshots(*, keys: list[SettledKey]) -> list[tuple[bool, Snapshot | None] | None]:
    """For each key, in order: whether its task, visible to the key's owner on its agent, has
    settled (terminal or interrupted; with `after_seq`, by a status event after that seq),
    and then its snapshot (as `task_snapshots_for_owner` reads it), read together: (True,
    snapshot) or (False, None); None for unknown and foreign ids. One statement on
    PostgreSQL however many keys."""
    return get_task_store().settled_snapshots(keys)


def task_event_rows(task_id: object, *, after: int, limit: int) -> list[tuple[int, str, dict]]:
    """`(seq, kind, payload)` of a task's events after `after`, in order, at most `limit`."""
    return list(
        TaskEvent.objects.filter(task_id=task_id, seq__gt=after)
        .order_by("seq")
        .values_list("seq", "kind", "payload")[:limit]
    )


def task_answered_with_message(task_id: object) -> bool:
    """Whether the agent answered the task with a direct Message (spec §3.1.1)."""
    return bool(
        Task.objects.filter(pk=task_id).values_list("answered_with_message", flat=True).first()
    )


def task_trace(task_id: object) -> tuple[str, str]:
    """A task's stored W3C (traceparent, tracestate); ("", "") when it has none."""
    row = Task.objects.filter(pk=task_id).values_list("traceparent", "tracestate").first()
    return row or ("", "")


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


# --- the management API's reads (operators see every owner's tasks) -------------------------

# The orderings a task list may ask for; each ends with the id in the same direction, so a
# keyset cursor over it never repeats or skips a task.
TASK_ORDERINGS = (
    "-updated_at",
    "updated_at",
    "-created_at",
    "created_at",
    "-status_timestamp",
    "status_timestamp",
)


def task_orphaned_q() -> Q:
    """The one definition of an orphaned task: a rebind's cutover left one of its push
    channels orphaned (the mark `webhooks.rebinds.channel_moves.mark_orphaned` writes under the
    push-channel extension's URI) and no operator has re-bound it yet."""
    # A key path, not `contains`: SQLite (the embedded mode) has no JSON containment.
    return Q(**{f"metadata__{PUSH_CHANNEL_URI}__orphaned": True})


def task_list(
    *,
    agent_slug: str | None = None,
    state: str | None = None,
    context_id: str | None = None,
    orphaned: bool | None = None,
    updated_since: datetime | None = None,
    ordering: str = "-updated_at",
) -> QuerySet[Task]:
    """Every owner's tasks (each annotated `orphaned`), filtered by what is given, in
    `ordering` (one of TASK_ORDERINGS) with the id as its tie-break. `updated_since`: a task
    event (status, artifact, message) was written at or after it."""
    if ordering not in TASK_ORDERINGS:
        raise ValueError(f"ordering must be one of {', '.join(TASK_ORDERINGS)}")
    qs = _with_orphaned(Task.objects.select_related("agent"))
    if agent_slug is not None:
        qs = qs.filter(agent__slug=agent_slug)
    if state is not None:
        qs = qs.filter(state=state)
    if context_id is not None:
        qs = qs.filter(context_id=context_id)
    if orphaned is True or orphaned is False:
        qs = qs.filter(orphaned=orphaned)
    if updated_since is not None:
        qs = qs.filter(updated_at__gte=updated_since)
    tie = "-id" if ordering.startswith("-") else "id"
    return qs.order_by(ordering, tie)


def task_read(task_id: object) -> Task | None:
    """One task of any agent and owner with its agent, annotated `orphaned` (an operator's
    read); None for an unknown or malformed id."""
    pk = _uuid(task_id)
    if pk is None:
        return None
    return _with_orphaned(Task.objects.select_related("agent")).filter(pk=pk).first()


def _with_orphaned(qs: QuerySet[Task]) -> QuerySet[Task]:
    """Each task annotated `orphaned`, True or False, by the one definition, task_orphaned_q.
    A CASE, not the lookup itself: the lookup is NULL on a task whose metadata has no such key
    (most tasks), on both stores, and NOT NULL is NULL too (`exclude` listed no task)."""
    orphaned = Case(
        When(task_orphaned_q(), then=Value(True)),
        default=Value(False),
        output_field=BooleanField(),
    )
    return qs.annotate(orphaned=orphaned)


# --- figures the metrics read (a2a_platform/metrics.py) -------------------------------------

TRANSITIONS_FAMILY = "task_transitions"
_SHORT_STATES = {s.value: s.short for s in TaskState}


def transition_tallies(events: QuerySet[TaskEvent]) -> dict[tuple[str, int, str], int]:
    """Per agent and state (its short name, `input-required`): the status events among
    `events`, one per task state change (the task's first, `submitted`, included). The
    purge folds the tallies of the events it deletes into agents.MetricBase."""
    state = KT("payload__statusUpdate__status__state")
    return {
        (TRANSITIONS_FAMILY, agent, _SHORT_STATES[value]): n
        for agent, value, n in events.filter(kind=EventKind.STATUS)
        .annotate(state=state)
        .values_list("task__agent_id", "state")
        .annotate(n=Count("id"))
        .order_by()
        if value in _SHORT_STATES  # a status event always names one; never fail a scrape
    }


def tasks_in_flight_per_agent() -> dict[int, int]:
    """Agent pk -> its tasks not in a terminal state (the `task_state` index)."""
    return dict(
        Task.objects.filter(state__in=IN_FLIGHT_VALUES)
        .values_list("agent_id")
        .annotate(n=Count("id"))
        .order_by()
    )


def executor_failures_per_agent() -> dict[int, int]:
    """Agent pk -> its executor runs that failed: the dispatch gave up (lost: the sweeper
    failed the task after A2A_DISPATCH_MAX_TRIES) or the run raised (its `error` is set).
    Dispatches are never deleted while their task exists, so this count never goes down."""
    return dict(
        ExecutorDispatch.objects.filter(Q(state=DispatchState.LOST) | ~Q(error=""))
        .values_list("task__agent_id")
        .annotate(n=Count("id"))
        .order_by()
    )
