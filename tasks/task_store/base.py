"""The task store's interface: `TaskStore`, one docstring per method, and the types its
methods take and return.

Two implementations, as Django's database backends implement one set of operations per
vendor: tasks/task_store/postgres.py (`PgTaskStore`, prepared SQL) and
tasks/task_store/orm.py (`OrmTaskStore`, the ORM, on any database).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from tasks.models import Artifact, ExecutorDispatch, Message, MessageReceipt, Task, TaskEvent

# The task fields a lifecycle write may change (the rest are set when the task opens).
LIFECYCLE_FIELDS = (
    "state",
    "status_timestamp",
    "status_message",
    "answered_with_message",
    "last_seq",
    "updated_at",
)


# A task with its history and artifacts: GetTask's read.
Snapshot = tuple[Task, list[Message], list[Artifact]]

# One task's write of `append_events`: the task as it is now, its new events (numbered from
# its last_seq before them), the artifact one of them adds or None.
EventsWrite = tuple[Task, list[TaskEvent], Artifact | None]


@dataclass(frozen=True)
class SnapshotKey:
    """Which task `visible_snapshots` reads, for whom, and how much of its history (None all,
    0 none, N the newest N)."""

    agent_pk: int
    owner: str
    task_pk: uuid.UUID
    history_limit: int | None


@dataclass(frozen=True)
class SettledKey(SnapshotKey):
    """A `settled_snapshots` key: with `after_seq`, the task has settled only once a status
    event came after that seq (a follow-up finds its task interrupted: not yet its answer)."""

    after_seq: int | None = None


@dataclass(frozen=True)
class DispatchClaimRow:
    """What `claim_dispatch` did to one dispatch row."""

    claimed: bool  # False: its task was terminal, the dispatch is DONE
    task_id: uuid.UUID
    progress: dict
    lease_expires_at: datetime | None
    executor: str  # the task's agent's executor
    dispatch_id: int = 0
    # The parts of the task's latest user message, read with a quick claim
    # (`claim_next_dispatches`: the quick executors' whole read); None otherwise.
    user_parts: list | None = None
    # The task row as a quick claim read it, not locked; None otherwise.
    task: Task | None = None


class ReleaseOutcome(StrEnum):
    """What a released dispatch does next (the PostgreSQL statement computes the same values:
    tasks/task_store/claims.py)."""

    AGAIN = "again"  # the executor asked to run again later: pending, due at `again_at`
    INPUT = "input"  # a client message arrived during the run: pending, due now
    DONE = "done"  # the run is over: the dispatch is done


@dataclass(frozen=True)
class DispatchRelease:
    """What `release_dispatch` did, and the agent's executor."""

    outcome: ReleaseOutcome
    task_id: uuid.UUID
    executor: str


@dataclass(frozen=True)
class NewTask:
    """A new task's rows as `open_tasks` writes them (none saved yet), and the idempotency
    receipt it is written only with, if any."""

    task: Task
    message: Message
    event: TaskEvent
    dispatch: ExecutorDispatch
    receipt: MessageReceipt | None = None


class TaskStore(Protocol):
    """The rows of the task lifecycle, read and written inside the caller's transaction."""

    def claim_receipt(self, receipt: MessageReceipt) -> bool:
        """Insert an idempotency receipt unless one exists for its (agent, owner, messageId).

        True: inserted (`receipt` now has its pk). False: the request is a retry; nothing was
        written and the caller's transaction goes on.
        """
        ...

    def open_tasks(self, news: Sequence[NewTask]) -> list[bool]:
        """Insert new tasks' rows: each task, its first message, its first event and its
        executor dispatch, for any number of tasks (one statement on PostgreSQL), atomic on
        its own, all of them or none: outside a transaction it commits as it returns. Each
        object written gets its pk. No NOTIFY. True or False per task, in order.

        A task with a `receipt` is written only if its receipt is claimed, as
        `claim_receipt` does, in the same statement: False when the receipt was taken (a
        retry, or an earlier task of the same call with the same agent, owner and
        messageId), and then none of that task's rows was written."""
        ...

    def lock(self, task_pk: uuid.UUID) -> Task | None:
        """The task row locked FOR UPDATE until the transaction ends, with its agent loaded
        (only the task row is locked: locking the agent too would make every write to any task
        of that agent wait for the others). None for an unknown id."""
        ...

    def artifact(self, task: Task, artifact_id: str) -> Artifact | None:
        """One artifact of a task by its artifactId, or None."""
        ...

    def visible(self, agent_pk: int, owner: str, task_pk: uuid.UUID) -> Task | None:
        """The task if it belongs to this agent and owner, else None (foreign = unknown)."""
        ...

    def visible_snapshots(self, keys: list[SnapshotKey]) -> list[Snapshot | None]:
        """For each key, in order: `visible`, `history` (the key's `history_limit`) and
        `artifacts` of its task together, or None (unknown or foreign). One statement on
        PostgreSQL however many keys: GetTask's read, its concurrent calls read together
        (a2a_platform/lib/orm.Coalesced)."""
        ...

    def latest_user_parts(self, task_pk: uuid.UUID) -> list | None:
        """The parts of the task's latest user message (None: it has none): a quick executor's
        whole read, one column of one row."""
        ...

    def settled_snapshots(
        self, keys: list[SettledKey]
    ) -> list[tuple[bool, Snapshot | None] | None]:
        """For each key, in order, whether its task (`visible` to the key's agent and owner)
        has settled: it is terminal or interrupted and, with `after_seq`, a status event came
        after that seq. Settled: (True, its snapshot as `visible_snapshots` reads it), read
        with it; not yet: (False, None); None when it is not visible. One statement on
        PostgreSQL however many keys: blocking SendMessages' reads on a wake-up (the waiters
        an answered batch wakes together read together), their answers included."""
        ...

    def history(self, task: Task, limit: int | None) -> list[Message]:
        """The task's messages oldest first: all (None) or the newest `limit`; each message's
        `task` is `task` (no query to reach it)."""
        ...

    def artifacts(self, task: Task) -> list[Artifact]:
        """The task's artifacts in the order they were first added."""
        ...

    def append_events(
        self, task: Task, events: list[TaskEvent], artifact: Artifact | None = None
    ) -> bool:
        """Insert the events (each gets its pk; one statement on PostgreSQL however many),
        write the task row's LIFECYCLE_FIELDS as they are on `task` (updated_at stamped), and
        queue the event hub's NOTIFY for commit. A terminal state written closes the task's
        active (pending or claimed) dispatches too, DONE: a finished task has nothing left
        to run. With `artifact` (the one an artifact event among them adds), insert it, or
        replace the one with its (task, artifactId) in place (it keeps its pk and created_at,
        which are set on `artifact`), in the same statement.

        All of it only if the stored task has not moved since `task` was read: its last_seq
        is still the one before the first event (every lifecycle write moves it). True:
        written. False: the task moved (or is gone); nothing was written or queued. A caller
        with the task locked always gets True; one that read the task unlocked (a quick
        claim) writes this way without taking the lock first."""
        ...

    def append_events_together(self, writes: Sequence[EventsWrite]) -> set[object]:
        """`append_events` for several tasks (each at most once), in one statement on
        PostgreSQL however many: every one of their task rows locked in id order (a rebind's
        order), the moved ones too, then each one written, with its events, its artifact and
        its dispatches closed, only if it has not moved. Returns the pks of the tasks
        written; the others wrote nothing, and a caller that then writes one of them under
        its lock takes no lock out of order."""
        ...

    def claim_dispatch(
        self, dispatch_id: int, worker: str, now: datetime, lease_until: datetime
    ) -> DispatchClaimRow | None:
        """Claim a pending, due dispatch for `worker` until `lease_until`, locking (and
        skipping when another transaction has it locked) only the dispatch row. A dispatch whose
        task is terminal is marked DONE instead (`claimed` False). None: gone, not pending,
        not yet due, or locked. Atomic on its own (`open_tasks`)."""
        ...

    def claim_next_dispatches(
        self,
        executors: tuple[str, ...],
        due_since: datetime,
        worker: str,
        now: datetime,
        lease_until: datetime,
        limit: int,
    ) -> list[DispatchClaimRow]:
        """Claim, as `claim_dispatch` does, the oldest `limit` pending dispatches of agents
        whose executor is one of `executors` that fell due in (`due_since`, `now`], skipping
        locked ones (one statement on PostgreSQL), oldest first, each claimed one with its
        task's row (`task`, not locked: `append_events` writes it only if it did not move)
        and `latest_user_parts` (`user_parts`). Empty: there is none. Atomic on its own
        (`open_tasks`)."""
        ...

    def release_dispatch(
        self,
        dispatch_id: int,
        worker: str,
        *,
        progress: dict | None,
        again_at: datetime | None,
        now: datetime,
    ) -> DispatchRelease | None:
        """Release `worker`'s claim: the task row locked first, then the dispatch (the
        lifecycle services' lock order). Pending again at `again_at` when it is given and the
        task is not terminal ("again"); pending now when the task waits for input and a client
        message came after its latest status change ("input"); else DONE ("done"). Both
        pending outcomes set `enqueues` to 1 (the caller publishes the job). `progress`
        None keeps the stored progress. None: the task or the claim is gone."""
        ...
