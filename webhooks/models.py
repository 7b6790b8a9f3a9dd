"""Push configs, their binding versions, endpoints and the delivery outbox.

A PushConfig is the client's registration (its `id` is the client-visible config id). Every
create with an existing id makes a new PushBinding version, never an in-place edit; each
Delivery pins the binding version it was created under (DESIGN.md invariant 3), so a rebind
never changes where or how an already-accepted delivery goes.
"""

from __future__ import annotations

import re
import uuid
from enum import StrEnum

from django.db import models

from tasks.states import IN_FLIGHT_VALUES

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
    # NULL: nothing owed, or parked (its endpoint is paused). webhooks/delivery/heads.py keeps it.
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
    # When it began taking deliveries. NULL: a rebind made it and it waits for the channel
    # notice on the previous version to be delivered (drain), or for an operator to re-bind an
    # orphaned task (cutover); what is written for it meanwhile is `held`
    # (webhooks/rebinds/operations.py).
    activated_at = models.DateTimeField(null=True, blank=True)
    # When it stopped taking new deliveries (what it already owes is still delivered).
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
    # Written for a binding that is not active yet (a rebind's new channel): sent once it is.
    HELD = "held", "held (its channel waits for a rebind notice)"
    # Ended by a rebind (cut over, or aborted before its notice was sent): `last_error` says.
    SUPERSEDED = "superseded", "superseded by a rebind"


OPEN_DELIVERY_STATES = (DeliveryState.PENDING, DeliveryState.SENDING)


class DeliveryKind(StrEnum):
    """What a delivery carries (`Delivery.kind`, the `X-A2A-Event-Kind` header)."""

    SNAPSHOT = "snapshot"  # the task as it is now: a registration's first delivery
    STATUS = "status"  # a task event (tasks.models.EventKind's values)
    ARTIFACT = "artifact"
    NOTICE = "notice"  # a rebind's channel notice, on the old binding


# What an operator's replay re-opens: a delivery that ended (never one still owed or held).
REPLAYABLE_STATES = (DeliveryState.DEAD, DeliveryState.DELIVERED)


class DeliveryQuerySet(models.QuerySet):
    def replayable(self) -> DeliveryQuerySet:
        """The one rule for what an operator's replay re-opens (`services.delivery_replay`,
        which the deliveries admin, the rebind page's "replay notice" and the API reach
        through `console.delivery_actions.delivery_replay_explained`): dead-lettered or
        delivered, of a live config (a deleted config's client asked to stop), and never a
        rebind notice whose move no longer waits for it (delivered, withdrawn by an abort, a
        "move now" or "finish on old", replaced by a cutover's final notice): replaying one
        would announce a channel that is not coming."""
        awaited = ChannelMove.objects.filter(
            notice=models.OuterRef("pk"), state=MoveState.NOTICE_PENDING
        )
        return self.filter(state__in=REPLAYABLE_STATES, config__deleted_at__isnull=True).exclude(
            models.Q(kind=DeliveryKind.NOTICE) & ~models.Q(models.Exists(awaited))
        )


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
    kind = models.CharField(max_length=16)  # a DeliveryKind
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

    objects = DeliveryQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["config", "state", "id"], name="delivery_config_head"),
            models.Index(fields=["state", "next_attempt_at"], name="delivery_due"),
            # A config's head: its first entry here (webhooks/delivery/heads.py).
            models.Index(
                fields=["config", "id"],
                condition=models.Q(state__in=["pending", "sending"]),
                name="delivery_open_by_config",
            ),
        ]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.event_id} ({self.state})"


class AttemptOutcome(models.TextChoices):
    """What recording an attempt decided, as `a2a_webhook_deliveries_total` labels it."""

    DELIVERED = "delivered", "delivered (2xx)"
    FAILED = "failed", "failed, tried again later"
    DEAD = "dead", "failed for good: dead-lettered"
    STALE = "stale", "answered after its lease passed: not recorded"


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
    # The failure in words (webhooks/delivery/transport.py's failure_detail): "connection refused",
    # "certificate has expired", "HTTP 503 Service Unavailable from the receiver". Never
    # the URL's path or query, the headers or a credential.
    error_detail = models.CharField(max_length=300, blank=True)
    # Written with the attempt's result (blank while it is in flight, or if its worker died).
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices, blank=True)
    # A delivered attempt's time from its event's write (the delivery row, written in the
    # transition's transaction) to the receiver's 2xx, in microseconds: whole numbers, so the
    # metric's sum (a2a_webhook_delivery_latency_seconds) adds up exactly however its rows
    # are split between the live ones and what retention folded away.
    latency_us = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number}"  # its place in its run: the admin's "n of m"


class AlertKind(models.TextChoices):
    AUTH_REJECTED = "auth_rejected", "receiver rejected our credentials or signature"
    DEAD_LETTER = "dead_letter", "delivery dead-lettered"
    ENDPOINT_FAILING = "endpoint_failing", "endpoint failing"
    REBIND_DEADLINE = "rebind_deadline", "rebind deadline approaching with tasks on the old channel"
    REBIND_NOTICE_DEAD = "rebind_notice_dead", "a rebind notice dead-lettered"
    SIGNING_KEY_MISSING = "signing_key_missing", "an agent without a signing key: deliveries wait"
    TASKS_OUTLIVE_CARD = "tasks_outlive_card", "tasks outlive the card clients hold"


class Alert(models.Model):
    """Something an operator must look at; shown on the admin index and in /readyz."""

    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    endpoint = models.ForeignKey(Endpoint, null=True, blank=True, on_delete=models.CASCADE)
    rebind = models.ForeignKey("Rebind", null=True, blank=True, on_delete=models.CASCADE)
    message = models.CharField(max_length=500)
    count = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(auto_now=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.message}"


class RebindState(models.TextChoices):
    """webhooks/rebinds/machine.py holds the transitions."""

    SCHEDULED = "scheduled", "scheduled"
    PREPARING = "preparing", "preparing (new key published, not signing yet)"
    DRAINING = "draining", "draining"
    COMPLETED = "completed", "completed"
    CUT_OVER = "cut_over", "cut over"
    ABORTED = "aborted", "aborted"


class Rebind(models.Model):
    """One rebind of an agent's push channels: an audited, two-phase operation.

    Scope (any combination): rotate the agent's signing key; move every live config whose URL
    starts with `move_from` to `move_to` (optionally only on `move_origin`); replace one
    config's URL and/or credentials (`config` and the `new_*` fields; a client re-registering
    a config id is this scope). The policy and the deadline action are declared up front.
    webhooks/rebinds/operations.py runs it; one ChannelMove row per config it moves.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey("agents.Agent", on_delete=models.CASCADE, related_name="rebinds")
    rotate_key = models.BooleanField(default=False)
    move_from = models.CharField(max_length=2048, blank=True)
    move_to = models.CharField(max_length=2048, blank=True)
    move_origin = models.CharField(max_length=300, blank=True)
    config = models.ForeignKey(
        PushConfig, null=True, blank=True, on_delete=models.CASCADE, related_name="rebinds"
    )
    new_url = models.CharField(max_length=2048, blank=True)
    new_token_encrypted = models.TextField(blank=True)
    new_auth_scheme = models.CharField(max_length=64, blank=True)
    new_credentials_encrypted = models.TextField(blank=True)
    replaces_credentials = models.BooleanField(default=False)  # else the config keeps its own
    # The client's new binding, when the client re-registered the config (already made).
    client_binding = models.ForeignKey(
        PushBinding, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    policy = models.CharField(max_length=8)  # agents.models.PushChannelPolicy
    finish_on_old = models.BooleanField(
        default=False, help_text="drain: in-flight tasks stay on the old channel until terminal"
    )
    state = models.CharField(
        max_length=16, choices=RebindState.choices, default=RebindState.PREPARING
    )
    deadline_seconds = models.PositiveIntegerField()
    deadline = models.DateTimeField(null=True, blank=True)
    on_timeout = models.CharField(max_length=8)  # agents.models.OnDrainTimeout
    extended_at = models.DateTimeField(null=True, blank=True)
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500, blank=True)
    forced = models.BooleanField(default=False)
    scheduled_for = models.DateTimeField(null=True, blank=True)
    old_key = models.ForeignKey(
        "agents.SigningKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    new_key = models.ForeignKey(
        "agents.SigningKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Preparing: the new key signs from this time on (published for the minimum overlap).
    activate_key_at = models.DateTimeField(null=True, blank=True)
    # Draining: the configs whose current binding was made before this time are the old version.
    cutoff = models.DateTimeField(null=True, blank=True)
    moves_planned = models.BooleanField(default=False)  # every old-version config has its move
    plan_cursor = models.BigIntegerField(default=0)  # the last config pk planned (keyset)
    # After completion: when the old key retires (last old delivery + retry horizon + tolerance).
    old_key_retire_after = models.DateTimeField(null=True, blank=True)
    alerted_percent = models.PositiveSmallIntegerField(default=0)  # 0, 50, 90, 100
    counts = models.JSONField(default=dict, blank=True)
    counts_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state"], name="rebind_state")]
        permissions = [("run_rebind", "Can start, cut over, extend and abort rebinds")]

    def __str__(self) -> str:
        return f"rebind {self.pk} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_REBIND_STATES


OPEN_REBIND_STATES = (RebindState.SCHEDULED, RebindState.PREPARING, RebindState.DRAINING)


class MoveState(models.TextChoices):
    NOTICE_PENDING = "notice_pending", "notice pending on the old channel"
    MOVED = "moved", "moved to the new channel"
    FINISHING_ON_OLD = "finishing_on_old", "finishing on the old channel"
    FINISHED_ON_OLD = "finished_on_old", "finished on the old channel"
    ORPHANED = "orphaned", "orphaned (cut over)"
    REBOUND = "rebound", "orphan re-bound (by an operator or the client)"
    REVERTED = "reverted", "reverted (rebind aborted before the move)"
    CONFIG_DELETED = "config_deleted", "ended: the client deleted the config"


class ChannelMoveQuerySet(models.QuerySet):
    """The rebinds' predicates over moves, each written once (docs/decisions.md, "Rebinds'
    rules, one home each (issue 44)")."""

    @staticmethod
    def on_old_q() -> models.Q:
        """`on_old()` as a Q, for the aggregates that count it beside other things in one
        query (`Count("id", filter=...)`: the dashboard, the console's progress)."""
        return models.Q(config__deleted_at__isnull=True) & (
            models.Q(state=MoveState.NOTICE_PENDING)
            | models.Q(state=MoveState.FINISHING_ON_OLD, task__state__in=IN_FLIGHT_VALUES)
        )

    def on_old(self) -> ChannelMoveQuerySet:
        """The moves still on the old version, as every interface shows and counts them (the
        console's live list and progress, the dashboard, `selectors.rebind_counts` and
        `rebind_stragglers`, so the API and the `rebind` command): a move waiting for its
        notice, whatever its task's state (what the task emitted meanwhile is held for the
        new version until the notice is delivered, or dead-lettered and waiting for an
        operator), or a task finishing on the old channel that is still in flight; never a
        deleted config's (its client asked to stop)."""
        return self.filter(self.on_old_q())

    @classmethod
    def notice_dead_q(cls) -> models.Q:
        """`notice_dead()` as a Q, for the console's progress aggregate."""
        return cls.on_old_q() & models.Q(
            state=MoveState.NOTICE_PENDING, notice__state=DeliveryState.DEAD
        )

    def notice_dead(self) -> ChannelMoveQuerySet:
        """The moves on the old version because their notice dead-lettered: what the
        `rebind_notice_dead` alert names, the rebind page lists as stuck and "Replay notice"
        re-opens (a dead notice whose move was decided otherwise is not one of them)."""
        return self.filter(self.notice_dead_q())

    def keeping_drain_open(self) -> ChannelMoveQuerySet:
        """The moves that keep a draining rebind from completing, and that a cutover orphans
        (`operations._drain_step`, `_cut_over`): exactly `on_old()`, by decision. The drain
        once counted a finished task whose notice was still open while the console did not
        (and a finished task whose notice was dead counted nowhere, so the drain completed
        with its last events held for good); since issue 43 both count it, so an operator
        never sees "0 left" on a rebind that is still draining, nor the reverse. Named apart
        so that the drain's call site says what it asks; a change to one is a change to both,
        which `test_on_old_is_what_keeps_the_drain_open` holds."""
        return self.on_old()


class ChannelMove(models.Model):
    """One config's move in a rebind: from `old_binding` to `new_binding`, announced by
    `notice` (a delivery on the old binding). The per-task channel history is these rows
    with the binding versions."""

    rebind = models.ForeignKey(Rebind, on_delete=models.CASCADE, related_name="moves")
    config = models.ForeignKey(PushConfig, on_delete=models.CASCADE, related_name="moves")
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="channel_moves")
    old_binding = models.ForeignKey(PushBinding, on_delete=models.PROTECT, related_name="+")
    new_binding = models.ForeignKey(
        PushBinding, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    notice = models.ForeignKey(
        Delivery, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    state = models.CharField(max_length=16, choices=MoveState.choices)
    from_seq = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = ChannelMoveQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["rebind", "config"], name="channelmove_once")
        ]
        indexes = [
            models.Index(fields=["rebind", "state"], name="channelmove_rebind_state"),
            models.Index(fields=["notice"], name="channelmove_notice"),
        ]

    def __str__(self) -> str:
        return f"{self.config_id}: {self.state}"
