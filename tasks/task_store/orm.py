"""`OrmTaskStore`: the task store through the ORM, on any database: the embedded SQLite
database of `make run`, and PostgreSQL behind a transaction-pooling proxy that cannot keep
prepared statements."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from django.db import IntegrityError, transaction

from tasks.models import (
    ACTIVE_DISPATCH_STATES,
    Artifact,
    DispatchState,
    EventKind,
    ExecutorDispatch,
    Message,
    MessageReceipt,
    MessageRole,
    Task,
    TaskEvent,
)
from tasks.notify import notify_task_event
from tasks.states import INTERRUPTED_STATES, SETTLED_STATES, TERMINAL_STATES
from tasks.task_store.base import (
    LIFECYCLE_FIELDS,
    DispatchClaimRow,
    DispatchRelease,
    EventsWrite,
    NewTask,
    ReleaseOutcome,
    SettledKey,
    Snapshot,
    SnapshotKey,
)


class OrmTaskStore:
    """TaskStore through the ORM, on any database."""

    def claim_receipt(self, receipt: MessageReceipt) -> bool:
        try:
            with transaction.atomic():  # a savepoint: the caller's transaction goes on
                receipt.save(force_insert=True)
        except IntegrityError:
            return False
        return True

    def open_tasks(self, news: Sequence[NewTask]) -> list[bool]:
        opened = []
        with transaction.atomic():  # atomic on its own, as the one statement is
            for new in news:
                if new.receipt is not None and not self.claim_receipt(new.receipt):
                    opened.append(False)
                    continue
                for row in (new.task, new.message, new.event, new.dispatch):
                    row.save(force_insert=True)
                opened.append(True)
        return opened

    def lock(self, task_pk: uuid.UUID) -> Task | None:
        return (
            Task.objects.select_for_update(of=("self",))
            .select_related("agent")
            .filter(pk=task_pk)
            .first()
        )

    def artifact(self, task: Task, artifact_id: str) -> Artifact | None:
        return Artifact.objects.filter(task=task, artifact_id=artifact_id).first()

    def visible(self, agent_pk: int, owner: str, task_pk: uuid.UUID) -> Task | None:
        return Task.objects.filter(pk=task_pk, agent_id=agent_pk, owner=owner).first()

    def visible_snapshots(self, keys: list[SnapshotKey]) -> list[Snapshot | None]:
        found: list[Snapshot | None] = []
        for key in keys:
            task = self.visible(key.agent_pk, key.owner, key.task_pk)
            found.append(self._snapshot(task, key.history_limit) if task is not None else None)
        return found

    def settled_snapshots(
        self, keys: list[SettledKey]
    ) -> list[tuple[bool, Snapshot | None] | None]:
        return [self._settled(key) for key in keys]

    def _settled(self, key: SettledKey) -> tuple[bool, Snapshot | None] | None:
        task = self.visible(key.agent_pk, key.owner, key.task_pk)
        if task is None:
            return None
        settled = task.task_state in SETTLED_STATES and (
            key.after_seq is None
            or TaskEvent.objects.filter(
                task_id=key.task_pk, kind=EventKind.STATUS, seq__gt=key.after_seq
            ).exists()
        )
        return (True, self._snapshot(task, key.history_limit)) if settled else (False, None)

    def _snapshot(self, task: Task, history_limit: int | None) -> Snapshot:
        history = self.history(task, history_limit) if history_limit != 0 else []
        return task, history, self.artifacts(task)

    def latest_user_parts(self, task_pk: uuid.UUID) -> list | None:
        return (
            Message.objects.filter(task_id=task_pk, role=MessageRole.USER)
            .order_by("-id")
            .values_list("parts", flat=True)
            .first()
        )

    def history(self, task: Task, limit: int | None) -> list[Message]:
        newest = task.messages.order_by("-id")
        messages = list(newest[:limit] if limit is not None else newest)[::-1]
        for message in messages:
            message.task = task
        return messages

    def artifacts(self, task: Task) -> list[Artifact]:
        return list(task.artifacts.order_by("id"))

    def append_events(
        self, task: Task, events: list[TaskEvent], artifact: Artifact | None = None
    ) -> bool:
        lifecycle = {
            name: Task._meta.get_field(name).pre_save(task, False) for name in LIFECYCLE_FIELDS
        }
        # The task row first: its UPDATE locks it and checks it has not moved.
        unmoved = Task.objects.filter(pk=task.pk, last_seq=events[0].seq - 1)
        if not unmoved.update(**lifecycle):
            return False
        if artifact is not None:
            artifact.save()
        for event in events:
            event.save(force_insert=True)
        if task.task_state in TERMINAL_STATES:
            ExecutorDispatch.objects.filter(
                task_id=task.pk, state__in=ACTIVE_DISPATCH_STATES
            ).update(state=DispatchState.DONE, lease_expires_at=None, updated_at=task.updated_at)
        notify_task_event(task.pk)
        return True

    def append_events_together(self, writes: Sequence[EventsWrite]) -> set[object]:
        ordered = sorted(writes, key=lambda write: str(write[0].pk))  # a rebind's lock order
        return {task.pk for task, events, art in ordered if self.append_events(task, events, art)}

    def claim_dispatch(
        self, dispatch_id: int, worker: str, now: datetime, lease_until: datetime
    ) -> DispatchClaimRow | None:
        due = ExecutorDispatch.objects.filter(
            pk=dispatch_id, state=DispatchState.PENDING, not_before__lte=now
        )
        with transaction.atomic():  # atomic on its own, as the one statement is
            return self._claim(due, worker, lease_until)

    def claim_next_dispatches(
        self,
        executors: tuple[str, ...],
        due_since: datetime,
        worker: str,
        now: datetime,
        lease_until: datetime,
        limit: int,
    ) -> list[DispatchClaimRow]:
        due = ExecutorDispatch.objects.filter(
            state=DispatchState.PENDING,
            not_before__lte=now,
            not_before__gt=due_since,
            task__agent__executor__in=executors,
        ).order_by("not_before")
        claimed = []
        with transaction.atomic():  # atomic on its own, as the one statement is
            while len(claimed) < limit:
                row = self._claim(due, worker, lease_until, quick=True)
                if row is None:
                    break
                if row.claimed:
                    row = replace(row, user_parts=self.latest_user_parts(row.task_id))
                claimed.append(row)
        return claimed

    def _claim(
        self, due, worker: str, lease_until: datetime, *, quick: bool = False
    ) -> DispatchClaimRow | None:
        dispatch = (
            due.select_for_update(skip_locked=True, of=("self",))
            .select_related("task__agent")
            .first()
        )
        if dispatch is None:
            return None
        executor = dispatch.task.agent.executor
        task = dispatch.task if quick else None
        if dispatch.task.task_state in TERMINAL_STATES:
            dispatch.state = DispatchState.DONE
            dispatch.save(update_fields=["state", "updated_at"])
            return DispatchClaimRow(
                False, dispatch.task_id, dispatch.progress, None, executor, dispatch.pk, task=task
            )
        dispatch.state = DispatchState.CLAIMED
        dispatch.claims += 1
        dispatch.claimed_by = worker[:255]
        dispatch.lease_expires_at = lease_until
        dispatch.save(
            update_fields=["state", "claims", "claimed_by", "lease_expires_at", "updated_at"]
        )
        return DispatchClaimRow(
            True, dispatch.task_id, dispatch.progress, lease_until, executor, dispatch.pk, task=task
        )

    def release_dispatch(
        self,
        dispatch_id: int,
        worker: str,
        *,
        progress: dict | None,
        again_at: datetime | None,
        now: datetime,
    ) -> DispatchRelease | None:
        task_id = (
            ExecutorDispatch.objects.filter(pk=dispatch_id)
            .values_list("task_id", flat=True)
            .first()
        )
        task = self.lock(task_id) if task_id is not None else None
        if task is None:
            return None
        dispatch = (
            ExecutorDispatch.objects.select_for_update()
            .filter(pk=dispatch_id, state=DispatchState.CLAIMED, claimed_by=worker[:255])
            .first()
        )
        if dispatch is None:
            return None
        if progress is not None:
            dispatch.progress = progress
        dispatch.lease_expires_at = None
        if again_at is not None and task.task_state not in TERMINAL_STATES:
            outcome = ReleaseOutcome.AGAIN
            dispatch.not_before = again_at
        elif _client_input_pending(task):
            outcome = ReleaseOutcome.INPUT
            dispatch.not_before = now
        else:
            outcome = ReleaseOutcome.DONE
        if outcome == ReleaseOutcome.DONE:
            dispatch.state = DispatchState.DONE
        else:
            dispatch.state = DispatchState.PENDING
            dispatch.enqueues = 1
        dispatch.save(
            update_fields=[
                "progress",
                "lease_expires_at",
                "state",
                "not_before",
                "enqueues",
                "updated_at",
            ]
        )
        return DispatchRelease(outcome, task.pk, task.agent.executor)


def _client_input_pending(task: Task) -> bool:
    """The task waits for input, yet a client message came after its latest status change."""
    if task.task_state not in INTERRUPTED_STATES:
        return False
    last_status = (
        TaskEvent.objects.filter(task=task, kind=EventKind.STATUS)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return TaskEvent.objects.filter(
        task=task,
        kind=EventKind.MESSAGE,
        seq__gt=last_status or 0,
        payload__message__role="ROLE_USER",
    ).exists()
