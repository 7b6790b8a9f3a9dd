"""The task store: the single source of truth for every A2A task.

Only `tasks.services` writes these models (each write one transaction that also appends the
task's TaskEvent). Read through `tasks.selectors`.
"""

from __future__ import annotations

import uuid

from django.db import models

from tasks.states import TaskState


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by task_list and task_ctx, which lead with it (every index is paid for on each
    # status change: no single-column twin of a composite's first column, no LIKE index).
    agent = models.ForeignKey(
        "agents.Agent", on_delete=models.PROTECT, related_name="tasks", db_index=False
    )
    context_id = models.CharField(max_length=255)
    # Who created it: "key:<api key uuid>" or "anonymous". Every read is scoped by it (with
    # the agent: task_list).
    owner = models.CharField(max_length=64)
    state = models.CharField(max_length=32, choices=[(s.value, s.short) for s in TaskState])
    status_timestamp = models.DateTimeField()
    status_message = models.JSONField(null=True, blank=True, help_text="A2A Message (ProtoJSON)")
    metadata = models.JSONField(default=dict, blank=True)
    # The card this agent served when the task was created: what the client may still trust.
    card_version = models.ForeignKey(
        "agents.CardVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The agent answered the first message with a direct Message instead of task work.
    answered_with_message = models.BooleanField(default=False)
    last_seq = models.PositiveIntegerField(default=0)
    # The task's W3C trace context (a2a_platform/lib/tracing.py): the SendMessage caller's
    # `traceparent`, else a trace of its own; its executor runs and webhook deliveries
    # continue it in any process. Empty when propagation was off (OTEL_PROPAGATORS=none).
    traceparent = models.CharField(max_length=55, blank=True, default="")
    tracestate = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-status_timestamp", "-id"]
        indexes = [
            models.Index(fields=["agent", "owner", "-status_timestamp", "-id"], name="task_list"),
            models.Index(fields=["agent", "context_id", "-status_timestamp"], name="task_ctx"),
            # The management API's contextId filter across agents; the dashboard's in-flight
            # tasks by state.
            models.Index(fields=["context_id"], name="task_context"),
            models.Index(fields=["state"], name="task_state"),
        ]

    def __str__(self) -> str:
        return str(self.id)

    @property
    def task_state(self) -> TaskState:
        return TaskState(self.state)


class MessageRole(models.TextChoices):
    USER = "ROLE_USER", "user"
    AGENT = "ROLE_AGENT", "agent"


class Message(models.Model):
    """One entry of a task's history, in the order it was appended."""

    task = models.ForeignKey(  # indexed by msg_task_mid
        Task, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    message_id = models.CharField(max_length=255)
    role = models.CharField(max_length=16, choices=MessageRole.choices)
    parts = models.JSONField()
    metadata = models.JSONField(default=dict, blank=True)
    extensions = models.JSONField(default=list, blank=True)
    reference_task_ids = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task", "id"]
        indexes = [models.Index(fields=["task", "message_id"], name="msg_task_mid")]

    def __str__(self) -> str:
        return self.message_id


class Artifact(models.Model):
    """An artifact assembled from its chunks (append / lastChunk)."""

    task = models.ForeignKey(  # indexed by artifact_unique_per_task
        Task, on_delete=models.CASCADE, related_name="artifacts", db_index=False
    )
    artifact_id = models.CharField(max_length=255)
    name = models.CharField(max_length=255, blank=True)
    description = models.TextField(blank=True)
    parts = models.JSONField(default=list)
    metadata = models.JSONField(default=dict, blank=True)
    extensions = models.JSONField(default=list, blank=True)
    complete = models.BooleanField(default=False, help_text="lastChunk seen")
    chunks = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["task", "id"]
        constraints = [
            models.UniqueConstraint(fields=["task", "artifact_id"], name="artifact_unique_per_task")
        ]

    def __str__(self) -> str:
        return self.artifact_id


class EventKind(models.TextChoices):
    STATUS = "status", "status update"
    ARTIFACT = "artifact", "artifact update"
    MESSAGE = "message", "message appended"


class TaskEvent(models.Model):
    """An ordered, durable fact about a task: gap-free `seq` per task.

    `id` is global and for display only: sequence values commit out of order across tasks,
    so every cursor is `(task_id, seq)`. `payload` is an A2A StreamResponse (ProtoJSON).
    """

    task = models.ForeignKey(  # indexed by event_seq_unique_per_task
        Task, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    payload = models.JSONField()
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["task", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["task", "seq"], name="event_seq_unique_per_task")
        ]

    def __str__(self) -> str:
        return f"{self.task_id}#{self.seq}"


class DispatchState(models.TextChoices):
    PENDING = "pending", "pending"
    CLAIMED = "claimed", "claimed"
    DONE = "done", "done"
    LOST = "lost", "lost (task failed)"


ACTIVE_DISPATCH_STATES = (DispatchState.PENDING, DispatchState.CLAIMED)


class ExecutorDispatch(models.Model):
    """A durable request for an executor to work on a task, written with the task change.

    At most one is active per task. A Celery job or an external worker claims it with a lease;
    the sweeper re-enqueues what nobody claimed or whose lease lapsed, and after
    A2A_DISPATCH_MAX_TRIES enqueues fails the task visibly ("executor lost").
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="dispatches")
    state = models.CharField(
        max_length=16, choices=DispatchState.choices, default=DispatchState.PENDING
    )
    not_before = models.DateTimeField(help_text="Earliest time an executor may run it (ETA)")
    enqueues = models.PositiveIntegerField(default=0)
    claims = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=255, blank=True)
    # Executor-private progress (e.g. the scripted executor's program counter).
    progress = models.JSONField(default=dict, blank=True)
    error = models.TextField(
        blank=True,
        default="",
        db_default="",
        help_text="Why its run failed the task, as the worker logged it (a hosted executor's "
        "traceback, a refused event): for operators, never on the wire",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["task"],
                condition=models.Q(state__in=["pending", "claimed"]),
                name="dispatch_one_active_per_task",
            )
        ]
        indexes = [models.Index(fields=["state", "not_before"], name="dispatch_due")]

    def __str__(self) -> str:
        return f"dispatch {self.pk} ({self.state})"


class MessageReceipt(models.Model):
    """Idempotent SendMessage for authenticated principals.

    (agent, owner, messageId) names one request; `request_hash` tells a retry (same body:
    the same task is answered) from a conflicting reuse of the id (refused).
    """

    agent = models.ForeignKey(  # indexed by receipt_unique_message
        "agents.Agent", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    owner = models.CharField(max_length=64)
    message_id = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="receipts")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "owner", "message_id"], name="receipt_unique_message"
            )
        ]

    def __str__(self) -> str:
        return self.message_id
