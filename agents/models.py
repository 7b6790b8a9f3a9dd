"""Agents (each one a tenant), the API keys that authenticate callers and worker backends, and
the operators' audit (`OperatorAction`), which every app's services write."""

from __future__ import annotations

import secrets
import uuid

from django.core.validators import RegexValidator
from django.db import models

from agents import executor_spec

# Slugs that would collide with routes at the origin root (docs/decisions.md, "Protocol choices").
RESERVED_SLUGS = frozenset(
    {
        "tasks",
        "message",
        "extendedagentcard",
        "v1",
        ".well-known",
        "well-known",
        "admin",
        "api",
        "healthz",
        "readyz",
        "metrics",
        "static",
        "jsonrpc",
    }
)

slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$",
    "lowercase letters, digits and inner hyphens, at most 64 characters",
)


class Executor(models.TextChoices):
    ECHO = "echo", "echo (built-in)"
    SCRIPTED = "scripted", "scripted (built-in, deterministic)"
    EXTERNAL = "external", "external worker (REST API)"
    CONFORMANCE = (
        "conformance",
        "conformance (built-in, stays WORKING until told; docs/executors.md)",
    )


class AuthMode(models.TextChoices):
    PUBLIC = "public", "public (no credentials)"
    API_KEY = "api_key", "API key"


class AnonymousListing(models.TextChoices):
    """What ListTasks answers an anonymous caller (a public agent) who names no contextId."""

    REFUSE = "refuse", "refuse unless a contextId is named (the default)"
    ANONYMOUS_TASKS = "anonymous", "list every task anonymous callers made"
    EMPTY = "empty", "an empty list unless a contextId is named"


class PushChannelPolicy(models.TextChoices):
    """What a rebind of the agent's push channels does with in-flight tasks
    (webhooks/rebinds/operations.py)."""

    DRAIN = "drain", "drain (notice on the old channel, then move; the default)"
    CUTOVER = "cutover", "cutover (the old channel retires at once; in-flight tasks are orphaned)"


class OnDrainTimeout(models.TextChoices):
    CUTOVER = "cutover", "cut over what is left"
    EXTEND = "extend", "extend the deadline once and alert, then cut over"


class Agent(models.Model):
    slug = models.SlugField(max_length=64, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    description = models.TextField()
    version = models.CharField(max_length=64, default="1.0.0")
    provider_organization = models.CharField(max_length=200, blank=True)
    provider_url = models.URLField(blank=True)
    documentation_url = models.URLField(blank=True)
    skills = models.JSONField(default=list, blank=True, help_text="A2A AgentSkill objects")
    default_input_modes = models.JSONField(default=list, blank=True)
    default_output_modes = models.JSONField(default=list, blank=True)
    extensions = models.JSONField(
        default=list, blank=True, help_text="A2A AgentExtension objects declared in the card"
    )
    # Operator switches: a capability switched off is false in the card whatever the machinery.
    push_notifications_enabled = models.BooleanField(default=True)
    streaming_enabled = models.BooleanField(default=True)
    card_max_age = models.PositiveIntegerField(
        default=60, help_text="Cache-Control max-age of the agent card, in seconds"
    )
    # The push-channel rebind policy this agent declares in its card
    # (webhooks/rebinds/operations.py); a rebind that names no policy, and a client re-registering
    # a config id, use it.
    push_rebind_policy = models.CharField(
        max_length=8, choices=PushChannelPolicy.choices, default=PushChannelPolicy.DRAIN
    )
    push_rebind_deadline = models.PositiveIntegerField(
        default=86400, help_text="Default drain deadline of a rebind, in seconds"
    )
    push_rebind_on_timeout = models.CharField(
        max_length=8, choices=OnDrainTimeout.choices, default=OnDrainTimeout.CUTOVER
    )
    push_rebind_min_overlap = models.PositiveIntegerField(
        default=0,
        help_text="Seconds a new signing key is published before it signs (at least the card's "
        "max-age, which applies when this is lower)",
    )
    # Not `choices=`: besides the built-ins it may name hosted code, `python:<module>:<attribute>`
    # (agents/executor_spec.py); the built-ins are suggested by the admin's form (a datalist).
    executor = models.CharField(
        max_length=executor_spec.MAX_LENGTH,
        default=Executor.ECHO,
        validators=[executor_spec.validate_executor],
        help_text="A built-in (echo, scripted, conformance), external (the worker REST API), "
        "or python:<module>:<attribute>, an a2a-sdk AgentExecutor the workers host "
        "(docs/executors.md).",
    )
    auth_mode = models.CharField(max_length=16, choices=AuthMode.choices, default=AuthMode.PUBLIC)
    # Interoperability switches (docs/protocol.md; docs/decisions.md, "Protocol choices").
    anonymous_list_tasks = models.CharField(
        max_length=16,
        choices=AnonymousListing.choices,
        default=AnonymousListing.REFUSE,
        help_text="ListTasks by anonymous callers (public agents) that name no contextId.",
    )
    strict_version_header = models.BooleanField(
        default=False,
        help_text="A request without an A2A-Version header is 0.3, as the spec says (§3.6.2). "
        "Off: it is versioned by its method name (lenient, the default).",
    )
    is_default = models.BooleanField(
        default=False, help_text="Also served at the origin root (at most one agent)."
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="agents_single_default_agent",
            )
        ]

    def __str__(self) -> str:
        return self.slug


class ApiKeyKind(models.TextChoices):
    CLIENT = "client", "A2A client"
    WORKER = "worker", "worker backend"


class ApiKey(models.Model):
    """A random 256-bit token, stored as its SHA-256 digest and found by its public prefix.

    The token is shown once, at creation. It is `a2a_<prefix>_<secret>`; the prefix is not
    secret and makes lookup an index hit instead of a scan or a slow password hash.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="api_keys")
    kind = models.CharField(max_length=8, choices=ApiKeyKind.choices, default=ApiKeyKind.CLIENT)
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix})"

    @property
    def principal(self) -> str:
        return f"key:{self.id}"


class SigningKeyState(models.TextChoices):
    PUBLISHED = "published", "published (in the JWKS, not signing yet: a rebind prepares it)"
    ACTIVE = "active", "active (signs, in the JWKS)"
    RETIRING = "retiring", "retiring (still signs and stays in the JWKS until retired)"
    RETIRED = "retired", "retired (neither signs nor published)"


def new_key_id() -> str:
    return secrets.token_urlsafe(16)


class SigningKey(models.Model):
    """An agent's Ed25519 key for webhook signatures and push JWTs (agents/signing.py).

    At most one key per agent is active. A rebind that rotates first publishes the new key
    (`published`: in the JWKS, not signing) for its minimum overlap, then activates it; the
    previous active key becomes `retiring`: it keeps signing and stays in the JWKS until
    retired (DESIGN.md, invariant 3, drain). The private key is stored encrypted
    (a2a_platform.lib.crypto) and never shown.
    """

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="signing_keys")
    kid = models.CharField(max_length=64, unique=True, default=new_key_id, editable=False)
    algorithm = models.CharField(max_length=16, default="EdDSA", editable=False)
    public_key = models.CharField(
        max_length=64, editable=False, help_text="raw 32-byte Ed25519 key, base64url"
    )
    private_key_encrypted = models.TextField(editable=False)
    state = models.CharField(
        max_length=16, choices=SigningKeyState.choices, default=SigningKeyState.ACTIVE
    )
    created_at = models.DateTimeField(auto_now_add=True)
    retiring_since = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["agent"],
                condition=models.Q(state="active"),
                name="agents_single_active_signing_key",
            )
        ]
        indexes = [models.Index(fields=["agent", "state"], name="signingkey_agent_state")]

    def __str__(self) -> str:
        return f"{self.kid} ({self.state})"


class WorkerHeartbeat(models.Model):
    """Proof that a Celery worker is live end to end (broker → worker → store).

    Beat schedules `agents.heartbeat` on the `heartbeat` queue; the worker that runs it writes
    this row, naming the queues it consumes and whether it has re-enqueued its due backlog
    since it started. The readiness gate reads these rows (agents/readiness.py).
    """

    hostname = models.CharField(max_length=255, unique=True)
    queues = models.JSONField(default=list)
    started_at = models.DateTimeField()
    backlog_reenqueued_at = models.DateTimeField(null=True, blank=True)
    beat_at = models.DateTimeField()
    # Written at start and with each beat by a worker consuming `agents`: per hosted executor
    # of an enabled agent, None when it imports and constructs there, else why not (one line).
    hosted = models.JSONField(
        default=dict, blank=True, help_text="hosted executor spec: null (loads) or why not"
    )

    class Meta:
        ordering = ["-beat_at"]

    def __str__(self) -> str:
        return self.hostname


class WebInstance(models.Model):
    """A web process's own heartbeat, for the operators' dashboard: each process writes its
    readiness here every A2A_WEB_HEARTBEAT_SECONDS (a2a_platform/asgi.py), so one dashboard
    shows every instance behind the load balancer, not only the one that served the page.
    Rows of instances gone for A2A_WEB_INSTANCE_FORGET_SECONDS are deleted by the beats."""

    name = models.CharField(max_length=255, unique=True, help_text="host:pid")
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField()
    ready = models.BooleanField(default=False)
    draining = models.BooleanField(default=False)
    failing = models.JSONField(default=dict, blank=True, help_text="failing check: why")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class CardVersion(models.Model):
    """Every distinct card an agent has served (content hash = ETag), with when."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="card_versions")
    content_hash = models.CharField(max_length=64)
    card = models.JSONField()
    first_served_at = models.DateTimeField()
    last_served_at = models.DateTimeField()

    class Meta:
        ordering = ["-last_served_at"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "content_hash"], name="cardversion_unique")
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}:{self.content_hash[:12]}"


class OperatorAction(models.Model):
    """Audit of an operator's action (admin, API or command), written in the action's own
    transaction by its service. It lives here, at the bottom of the apps, so that every app's
    services can write it: agents' (an agent's edits, its API keys, its signing keys) as well
    as webhooks' (endpoints, alerts, deliveries, rebinds) and the API's tokens. The table
    keeps the name it had in webhooks (moved without a copy: agents 0010, webhooks 0009)."""

    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "webhooks_operatoraction"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.actor}: {self.action.replace('_', ' ')}"

    @classmethod
    def record(cls, actor: str, action: str, target: dict) -> OperatorAction:
        """The one way an action is audited (inside the action's transaction)."""
        return cls.objects.create(actor=actor[:150], action=action, target=target)


class MetricBase(models.Model):
    """What retention deleted, counted: a counter family's figure per agent and label (a
    delivery outcome, a task state, a latency bucket) is this row's value plus the same
    aggregate over the rows still stored (a2a_platform/metrics.py), so a purge never lowers
    a counter. Written only by the purge, in the transaction that deletes the rows it counts
    (`metric_base_add`). Here, at the bottom of the apps, for the same reason as
    `OperatorAction`: the webhooks and tasks tallies both fold into it."""

    family = models.CharField(max_length=32)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    label = models.CharField(max_length=64)
    value = models.BigIntegerField(default=0)  # whole numbers (latency sums in microseconds)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["family", "agent", "label"], name="metricbase_unique_series"
            )
        ]

    def __str__(self) -> str:
        return f"{self.family}{{{self.agent_id},{self.label}}}={self.value}"


class RequestDuration(models.Model):
    """The web processes' request-duration histogram, one row per method, route and status:
    each process adds what it served since its last flush (a2a_platform/metrics.py,
    `request_durations_flush`), so any process's scrape shows every process's requests.
    `buckets` holds the count per bucket of REQUEST_DURATION_BUCKETS (not cumulative), its
    last item the observations above the last bound."""

    method = models.CharField(max_length=16)
    route = models.CharField(max_length=200)
    status = models.PositiveSmallIntegerField()
    buckets = models.JSONField(default=list)
    total_seconds = models.FloatField(default=0)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["method", "route", "status"], name="requestduration_unique_series"
            )
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.route} {self.status}"
