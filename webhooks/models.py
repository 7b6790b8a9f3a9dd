"""Push configs, their binding versions, endpoints and the delivery outbox.

A PushConfig is the client's registration (its `id` is the client-visible config id). Every
create with an existing id makes a new PushBinding version, never an in-place edit; each
Delivery pins the binding version it was created under (DESIGN.md invariant 3), so a rebind
never changes where or how an already-accepted delivery goes.
"""

from __future__ import annotations

import re
import uuid

from django.db import models

# A config id is a path segment of the REST binding and part of the X-A2A-Binding-Version
# header: URL-unreserved characters only, and not "." or "..", which clients resolve away.
CONFIG_ID = re.compile(r"(?!\.\.?$)[A-Za-z0-9._~-]{1,255}")


class Endpoint(models.Model):
    """A receiver origin (scheme://host:port): failure count, pause state, in-flight cap."""

    origin = models.CharField(max_length=300, unique=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_reason = models.CharField(max_length=300, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["origin"]

    def __str__(self) -> str:
        return self.origin


class PushConfig(models.Model):
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="push_configs")
    config_id = models.CharField(max_length=255)
    current_version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # When its head delivery (oldest open one) is due: the delivery queue claims by this, so a
    # claim reads a batch of configs off an index, whatever the backlog behind each head.
    # NULL: nothing owed, or parked (its endpoint is paused). webhooks/heads.py keeps it.
    head_due_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["task", "id"]
        constraints = [
            models.UniqueConstraint(fields=["task", "config_id"], name="pushconfig_unique_id")
        ]
        indexes = [
            models.Index(
                fields=["head_due_at", "id"],
                condition=models.Q(head_due_at__isnull=False),
                name="pushconfig_head_due",
            )
        ]
        verbose_name = "push config"

    def __str__(self) -> str:
        return f"{self.config_id} v{self.current_version}"


class PushBinding(models.Model):
    """One immutable version of a push config: where and how its deliveries go."""

    config = models.ForeignKey(PushConfig, on_delete=models.CASCADE, related_name="bindings")
    version = models.PositiveIntegerField()
    url = models.URLField(max_length=2048)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.PROTECT, related_name="bindings")
    token_encrypted = models.TextField(blank=True)
    auth_scheme = models.CharField(max_length=64, blank=True)
    credentials_encrypted = models.TextField(blank=True)
    # The agent's card URL as the client reached it: the `iss` of delivery JWTs.
    issuer = models.CharField(max_length=2048, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["config", "version"]
        constraints = [
            models.UniqueConstraint(fields=["config", "version"], name="binding_unique_version")
        ]

    def __str__(self) -> str:
        return f"{self.config.config_id} v{self.version}"


class DeliveryState(models.TextChoices):
    PENDING = "pending", "pending"
    SENDING = "sending", "sending"
    DELIVERED = "delivered", "delivered"
    DEAD = "dead", "dead-lettered"
    CANCELED = "canceled", "canceled (config deleted)"


OPEN_DELIVERY_STATES = (DeliveryState.PENDING, DeliveryState.SENDING)


class Delivery(models.Model):
    """One StreamResponse owed to one binding: written with the event, delivered at least once.

    `event_id` is the `webhook-id` (stable across retries and replays); `seq` the task's event
    sequence (`X-A2A-Task-Seq`). `body` holds the exact bytes that are signed and sent.
    """

    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    config = models.ForeignKey(PushConfig, on_delete=models.CASCADE, related_name="deliveries")
    binding = models.ForeignKey(PushBinding, on_delete=models.PROTECT, related_name="deliveries")
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="deliveries")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16)  # snapshot | status | artifact
    body = models.TextField()
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["config", "state", "id"], name="delivery_config_head"),
            models.Index(fields=["state", "next_attempt_at"], name="delivery_due"),
            # A config's head: its first entry here (webhooks/heads.py).
            models.Index(
                fields=["config", "id"],
                condition=models.Q(state__in=["pending", "sending"]),
                name="delivery_open_by_config",
            ),
        ]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.event_id} ({self.state})"


class DeliveryAttempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempts_log")
    number = models.PositiveIntegerField()
    url = models.URLField(max_length=2048)
    started_at = models.DateTimeField()
    duration_ms = models.FloatField(null=True, blank=True)
    status = models.PositiveIntegerField(null=True, blank=True)
    error_class = models.CharField(max_length=32, blank=True)
    response_excerpt = models.TextField(blank=True)
    request_headers = models.JSONField(default=dict, blank=True)
    manual = models.BooleanField(default=False, help_text="an operator replay")

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"


class AlertKind(models.TextChoices):
    AUTH_REJECTED = "auth_rejected", "receiver rejected our credentials or signature"
    DEAD_LETTER = "dead_letter", "delivery dead-lettered"
    ENDPOINT_FAILING = "endpoint_failing", "endpoint failing"


class Alert(models.Model):
    """Something an operator must look at; shown on the admin index and in /readyz."""

    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    endpoint = models.ForeignKey(Endpoint, null=True, blank=True, on_delete=models.CASCADE)
    message = models.CharField(max_length=500)
    count = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(auto_now=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class OperatorAction(models.Model):
    """Audit of an operator's action (admin or API), written with the action itself."""

    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.actor}: {self.action}"

    @classmethod
    def record(cls, actor: str, action: str, target: dict) -> OperatorAction:
        """The one way an action is audited (inside the action's transaction)."""
        return cls.objects.create(actor=actor[:150], action=action, target=target)
