"""Reads of the webhooks app: what is due, push configs' current bindings, deliveries for
the operators' API. No writes here (webhooks/services.py, webhooks/delivery/claim_record.py)."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import (
    Avg,
    Count,
    F,
    Max,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents.card_render import PUSH_CHANNEL_URI
from agents.models import Agent, SigningKey, SigningKeyState
from tasks.errors import TaskNotFound
from tasks.models import Task
from tasks.states import TaskState
from webhooks.errors import RebindInvalid
from webhooks.models import (
    CONFIG_ID,
    OPEN_DELIVERY_STATES,
    OPEN_REBIND_STATES,
    AttemptOutcome,
    ChannelMove,
    ChannelMoveQuerySet,
    Delivery,
    DeliveryAttempt,
    DeliveryKind,
    DeliveryState,
    Endpoint,
    MoveState,
    PushBinding,
    PushConfig,
    Rebind,
)


def due_configs(limit: int = 1000) -> list[int]:
    """Configs whose head is due, longest-waiting first (each once: a config has one head;
    the rows queued behind a head that waits for its retry do not count): what is waiting
    for a pump. Configs parked on a paused endpoint are not due."""
    due = PushConfig.objects.filter(head_due_at__lte=timezone.now()).order_by("head_due_at", "id")
    return list(due.values_list("pk", flat=True)[:limit])


def current_bindings(task: Task) -> list[PushBinding]:
    """The current binding of each live push config of the task, by config id."""
    return list(
        PushBinding.objects.select_related("config")
        .filter(config__task=task, config__deleted_at__isnull=True, retired_at__isnull=True)
        .order_by("config_id")
    )


def current_binding(task: Task, config_id: str) -> PushBinding:
    """The current binding of one live config of the task. Raises TaskNotFound."""
    if not CONFIG_ID.fullmatch(config_id):  # never stored (a NUL would not even reach SQL)
        raise TaskNotFound(task.pk)
    binding = (
        PushBinding.objects.select_related("config")
        .filter(
            config__task=task,
            config__config_id=config_id,
            config__deleted_at__isnull=True,
            retired_at__isnull=True,
        )
        .first()
    )
    if binding is None:
        raise TaskNotFound(task.pk)  # the spec has no "config not found" error (§3.1.8)
    return binding


def agent_push_config(agent: Agent, task_id: object, config_id: str) -> PushConfig:
    """One push config of one of the agent's tasks, as a one-config rebind names it: the one
    lookup of the `rebind` command, the API and the console's wizard. Deleted or not (whether
    it may be rebound is the rebind's pre-check). Raises RebindInvalid on `config`, in the same
    words for all three, when the agent has no such config: a task id that is not a UUID,
    another agent's task, an unknown config id."""
    try:
        task_pk = uuid.UUID(str(task_id))
    except ValueError:
        task_pk = None
    config = None
    if task_pk is not None and CONFIG_ID.fullmatch(config_id or ""):
        config = (
            PushConfig.objects.select_related("task")
            .filter(task_id=task_pk, task__agent=agent, config_id=config_id)
            .first()
        )
    if config is None:
        raise RebindInvalid(
            "config", f"agent {agent.slug!r} has no config {config_id!r} on task {task_id}"
        )
    return config


def delivery_list(
    *,
    state: str | None = None,
    task_id: uuid.UUID | None = None,
    agent_slug: str | None = None,
    endpoint_origin: str | None = None,
) -> QuerySet[Delivery]:
    """Deliveries, newest first, with what the API renders of each, filtered by what is
    given."""
    qs = Delivery.objects.select_related(
        "task__agent", "config", "binding", "binding__endpoint"
    ).order_by("-id")
    if state is not None:
        qs = qs.filter(state=state)
    if task_id is not None:
        qs = qs.filter(task_id=task_id)
    if agent_slug is not None:
        qs = qs.filter(task__agent__slug=agent_slug)
    if endpoint_origin is not None:
        qs = qs.filter(binding__endpoint__origin=endpoint_origin)
    return qs


def delivery_by_event_id(event_id: uuid.UUID) -> Delivery | None:
    """One delivery with its attempt timeline, or None."""
    return (
        Delivery.objects.select_related("task__agent", "config", "binding__endpoint")
        .prefetch_related("attempts_log")
        .filter(event_id=event_id)
        .first()
    )


def delivery_pks(event_ids: Iterable[uuid.UUID]) -> list[int]:
    """The pks of the deliveries with these event ids (unknown ids are left out)."""
    return list(Delivery.objects.filter(event_id__in=list(event_ids)).values_list("pk", flat=True))


# --- rebinds ---------------------------------------------------------------------------------


def rebinds_with_on_old(rebinds: QuerySet[Rebind]) -> QuerySet[Rebind]:
    """The rebinds, each annotated `on_old_now`: its moves on the old version counted now by
    the one rule (`ChannelMoveQuerySet.on_old`), in the same query (the rebinds list: its stored
    counts are refreshed by the monitor, so they may lag a delivered notice)."""
    moves = (
        ChannelMove.objects.filter(rebind=OuterRef("pk"))
        .on_old()
        .order_by()
        .values("rebind")
        .annotate(n=Count("id"))
        .values("n")
    )
    return rebinds.annotate(on_old_now=Coalesce(Subquery(moves), 0))


def rebind_counts(rebind: Rebind) -> dict[str, Any]:
    """A rebind's live counts: tasks on the old version by state, moves by outcome, and its
    notices by delivery state (what the monitor stores on the row and the console shows)."""
    moves = ChannelMove.objects.filter(rebind=rebind)
    by_state = dict(moves.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    on_old = dict(
        moves.on_old()
        .values_list("task__state")
        .annotate(n=Count("id"))
        .values_list("task__state", "n")
    )
    notices = dict(
        Delivery.objects.filter(pk__in=moves.exclude(notice=None).values("notice"))
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    return {
        "onOldVersion": {TaskState(s).short: n for s, n in sorted(on_old.items())},
        "onOldVersionTotal": sum(on_old.values()),
        "moved": by_state.get(MoveState.MOVED, 0),
        "finishedOnOld": by_state.get(MoveState.FINISHED_ON_OLD, 0),
        "finishingOnOld": by_state.get(MoveState.FINISHING_ON_OLD, 0),
        "noticePending": by_state.get(MoveState.NOTICE_PENDING, 0),
        "orphaned": by_state.get(MoveState.ORPHANED, 0),
        "rebound": by_state.get(MoveState.REBOUND, 0),
        "reverted": by_state.get(MoveState.REVERTED, 0),
        "notices": {
            "delivered": notices.get(DeliveryState.DELIVERED, 0),
            "pending": notices.get(DeliveryState.PENDING, 0)
            + notices.get(DeliveryState.SENDING, 0),
            "dead": notices.get(DeliveryState.DEAD, 0),
            "superseded": notices.get(DeliveryState.SUPERSEDED, 0)
            + notices.get(DeliveryState.CANCELED, 0),
        },
    }


def rebind_stragglers(rebind: Rebind, limit: int = 100) -> list[dict[str, Any]]:
    """The tasks still on the old version (oldest move first): task, state, config, the old
    version, and where its notice stands."""
    rows = (
        ChannelMove.objects.filter(rebind=rebind)
        .on_old()
        .select_related("task", "config", "old_binding", "notice")
        .order_by("id")[:limit]
    )
    return [
        {
            "task": str(m.task_id),
            "state": m.task.task_state.short,
            "config": m.config.config_id,
            "version": f"{m.config.config_id}.v{m.old_binding.version}",
            "move": m.state,
            "notice": m.notice.state if m.notice else None,
            "noticeError": m.notice.last_error if m.notice else "",
            "since": m.created_at,
        }
        for m in rows
    ]


def push_channel_extension(agent: Agent, *, jwks_url: str) -> dict[str, Any]:
    """The card's declaration of how this agent rebinds push channels (AgentExtension,
    data only, not required): the policy, overlap, deadline and its action, the key ids of
    the current channel and of any draining one, the JWKS, the delivery guarantee."""
    keys = live_and_published_keys(agent)
    draining = [
        _present(
            {
                "rebindId": str(r.pk),
                "policy": r.policy,
                "state": r.state,
                "deadline": r.deadline.isoformat() if r.deadline else None,
                "oldKeyIds": [r.old_key.kid] if r.old_key_id else [],
                "movePrefix": r.move_from,
            }
        )
        for r in Rebind.objects.filter(agent=agent, state__in=OPEN_REBIND_STATES)
        .exclude(actor__startswith="client")
        .select_related("old_key")
        .order_by("created_at")
    ]
    return {
        "uri": PUSH_CHANNEL_URI,
        "description": "How this agent moves push channels (signing key, URLs) while tasks "
        "are in flight: a channel notice on the old channel first (docs/webhooks-receiving.md)",
        "required": False,
        # Empty values are left out: signed cards carry none (docs/decisions.md).
        "params": _present(
            {
                "policy": agent.push_rebind_policy,
                "minOverlapSeconds": max(agent.push_rebind_min_overlap, agent.card_max_age),
                "drainDeadlineSeconds": agent.push_rebind_deadline,
                "onTimeout": agent.push_rebind_on_timeout,
                "currentKeyIds": [k.kid for k in keys if k.state == SigningKeyState.ACTIVE],
                "nextKeyIds": [k.kid for k in keys if k.state == SigningKeyState.PUBLISHED],
                "drainingKeyIds": [k.kid for k in keys if k.state == SigningKeyState.RETIRING],
                "draining": draining,
                "jwksUrl": jwks_url,
                "deliveryGuarantee": "durable, at-least-once, in order per push config",
            }
        ),
    }


def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v not in (None, "", [], {})}


def live_and_published_keys(agent: Agent) -> list[SigningKey]:
    return list(
        SigningKey.objects.filter(
            agent=agent,
            state__in=[SigningKeyState.PUBLISHED, SigningKeyState.ACTIVE, SigningKeyState.RETIRING],
        ).order_by("-created_at", "-id")
    )


# --- the management API: push configs, channel history, endpoint health ---------------------


def binding_secrets_masked(binding: PushBinding) -> dict[str, Any]:
    """What an operator may see of a binding's credentials: whether a token is set, the
    authentication scheme and whether credentials are set. Never the secret, nor part of it:
    nothing is decrypted here (docs/decisions.md, "Secrets")."""
    out: dict[str, Any] = {"token": "set" if binding.token_encrypted else None}
    out["authentication"] = (
        {
            "scheme": binding.auth_scheme,
            "credentials": "set" if binding.credentials_encrypted else None,
        }
        if binding.auth_scheme or binding.credentials_encrypted
        else None
    )
    return out


def task_push_configs(task: Task, *, include_deleted: bool = True) -> list[PushConfig]:
    """The task's push configs by id, each with its binding versions (oldest first) and their
    endpoints prefetched; deleted ones too unless told otherwise (their history stays)."""
    qs = PushConfig.objects.filter(task=task)
    if not include_deleted:
        qs = qs.filter(deleted_at__isnull=True)
    versions = PushBinding.objects.select_related("endpoint").order_by("version")
    return list(qs.prefetch_related(Prefetch("bindings", queryset=versions)).order_by("config_id"))


def task_push_config(task: Task, config_id: str) -> PushConfig | None:
    """One config of the task (deleted ones too) with its versions; None when unknown."""
    if not CONFIG_ID.fullmatch(config_id):  # never stored
        return None
    versions = PushBinding.objects.select_related("endpoint").order_by("version")
    return (
        PushConfig.objects.filter(task=task, config_id=config_id)
        .prefetch_related(Prefetch("bindings", queryset=versions))
        .first()
    )


def binding_status(binding: PushBinding) -> str:
    """Where a binding version stands: `active` (takes deliveries), `waiting` (a rebind made
    it; it waits for its notice or an operator's re-bind), `retired`, or `retired_unused`
    (replaced before it ever took a delivery)."""
    if binding.retired_at is not None:
        return "retired" if binding.activated_at is not None else "retired_unused"
    return "active" if binding.activated_at is not None else "waiting"


def binding_version(config: PushConfig, binding: PushBinding) -> dict[str, Any]:
    """A binding version as operators see it: its channel name, status, URL and endpoint,
    credentials masked (`binding_secrets_masked`), and when it was made, activated, retired."""
    return {
        "configId": config.config_id,
        "version": binding.version,
        "channel": f"{config.config_id}.v{binding.version}",
        "status": binding_status(binding),
        "url": binding.url,
        "endpoint": binding.endpoint.origin,
        **binding_secrets_masked(binding),
        "createdAt": binding.created_at,
        "activatedAt": binding.activated_at,
        "retiredAt": binding.retired_at,
    }


def _notice_kind(body: str) -> str:
    """The notice's kind (channel-changed, channel-orphaned) from its StreamResponse body."""
    try:
        payload = json.loads(body)["statusUpdate"]["metadata"][PUSH_CHANNEL_URI]
        return str(payload["notice"])
    except (ValueError, KeyError, TypeError):
        return ""


def task_channel_history(task: Task) -> dict[str, Any]:
    """A task's push channel history, in time order: each config's binding versions (when
    made, activated, retired; credentials masked), the rebinds' moves of its configs (old and
    new version, outcome, times) and the channel notices sent on the old versions. Four
    queries whatever the history's length."""
    configs = task_push_configs(task)
    by_pk = {c.pk: c for c in configs}
    versions = [binding_version(c, b) for c in configs for b in c.bindings.all()]
    versions.sort(key=lambda v: (v["createdAt"], v["configId"], v["version"]))
    version_of = {b.pk: b.version for c in configs for b in c.bindings.all()}
    moves = list(ChannelMove.objects.filter(task=task).select_related("rebind").order_by("id"))
    move_rows = [
        {
            "rebindId": str(m.rebind_id),
            "rebindState": m.rebind.state,
            "configId": by_pk[m.config_id].config_id,
            "fromVersion": version_of.get(m.old_binding_id),
            "toVersion": version_of.get(m.new_binding_id),
            "state": m.state,
            "fromSeq": m.from_seq,
            "notice": None,  # its event id, filled in from the notices below
            "createdAt": m.created_at,
            "finishedAt": m.finished_at,
        }
        for m in moves
    ]
    notice_of_move = {m.notice_id: i for i, m in enumerate(moves) if m.notice_id}
    notices = Delivery.objects.filter(task=task, kind=DeliveryKind.NOTICE).order_by("id")
    notice_rows = []
    for n in notices:
        if n.pk in notice_of_move:
            move_rows[notice_of_move[n.pk]]["notice"] = str(n.event_id)
        notice_rows.append(
            {
                "id": str(n.event_id),
                "kind": _notice_kind(n.body),
                "configId": by_pk[n.config_id].config_id if n.config_id in by_pk else None,
                "version": version_of.get(n.binding_id),
                "state": n.state,
                "attempts": n.attempts,
                "lastError": n.last_error,
                "createdAt": n.created_at,
                "finishedAt": n.finished_at,
            }
        )
    return {"versions": versions, "moves": move_rows, "notices": notice_rows}


# The window an endpoint's success rate and latency are measured over.
ENDPOINT_HEALTH_WINDOW = timedelta(hours=1)


def endpoint_list(*, paused: bool | None = None, failing: bool | None = None) -> QuerySet[Endpoint]:
    """Endpoints by origin, filtered by pause state and failure streak when given."""
    qs = Endpoint.objects.all()
    if paused is not None:
        qs = qs.filter(paused_at__isnull=not paused)
    if failing is True:
        qs = qs.filter(consecutive_failures__gt=0)
    elif failing is False:
        qs = qs.filter(consecutive_failures=0)
    return qs.order_by("origin", "id")


def endpoint_read(endpoint_pk: object) -> Endpoint | None:
    try:
        pk = int(str(endpoint_pk))
    except ValueError:
        return None
    if not 0 < pk < 2**63:
        return None
    return Endpoint.objects.filter(pk=pk).first()


def endpoint_health(endpoints: Iterable[Endpoint], now: datetime | None = None) -> dict[int, dict]:
    """Per endpoint (by pk): whether it is paused (since when, why), failing (the streak, since
    when: its first failed attempt after its last success), what it owes (open and held
    deliveries), and over ENDPOINT_HEALTH_WINDOW its finished attempts, their success rate
    (2xx answers) and mean and worst latency. Three grouped queries for any number of
    endpoints."""
    now = now or timezone.now()
    rows = {e.pk: e for e in endpoints}
    pks = list(rows)
    window_start = now - ENDPOINT_HEALTH_WINDOW
    attempts = {
        r["delivery__binding__endpoint_id"]: r
        for r in DeliveryAttempt.objects.filter(
            delivery__binding__endpoint_id__in=pks,
            started_at__gte=window_start,
            duration_ms__isnull=False,
        )
        .values("delivery__binding__endpoint_id")
        .annotate(
            total=Count("id"),
            ok=Count("id", filter=Q(status__gte=200, status__lt=300)),
            mean=Avg("duration_ms"),
            worst=Max("duration_ms"),
        )
        .order_by()
    }
    owed: dict[int, dict[str, int]] = {pk: {} for pk in pks}
    for endpoint_pk, state, n in (
        Delivery.objects.filter(
            binding__endpoint_id__in=pks,
            state__in=[*OPEN_DELIVERY_STATES, DeliveryState.HELD],
        )
        .values_list("binding__endpoint_id", "state")
        .annotate(n=Count("id"))
        .order_by()
    ):
        owed[endpoint_pk][state] = n
    failing = [pk for pk, e in rows.items() if e.consecutive_failures]
    last_ok = "delivery__binding__endpoint__last_success_at"
    since = dict(
        DeliveryAttempt.objects.filter(
            Q(**{f"{last_ok}__isnull": True}) | Q(started_at__gt=F(last_ok)),
            delivery__binding__endpoint_id__in=failing,
            duration_ms__isnull=False,
        )
        .exclude(status__gte=200, status__lt=300)
        .values_list("delivery__binding__endpoint_id")
        .annotate(first=Min("started_at"))
        .values_list("delivery__binding__endpoint_id", "first")
        .order_by()
    )
    out: dict[int, dict] = {}
    for pk, e in rows.items():
        a = attempts.get(pk)
        out[pk] = {
            "paused": e.paused_at is not None,
            "pausedAt": e.paused_at,
            "pausedReason": e.paused_reason,
            "failing": e.consecutive_failures > 0,
            "consecutiveFailures": e.consecutive_failures,
            "failingSince": since.get(pk) if e.consecutive_failures else None,
            "lastSuccessAt": e.last_success_at,
            "lastFailureAt": e.last_failure_at,
            "pending": owed[pk].get(DeliveryState.PENDING, 0),
            "sending": owed[pk].get(DeliveryState.SENDING, 0),
            "held": owed[pk].get(DeliveryState.HELD, 0),
            "lastHour": {
                "attempts": a["total"] if a else 0,
                "succeeded": a["ok"] if a else 0,
                "successRate": round(a["ok"] / a["total"], 4) if a else None,
                "meanLatencyMs": round(a["mean"], 1) if a else None,
                "maxLatencyMs": round(a["worst"], 1) if a else None,
            },
        }
    return out


# --- figures the operators' dashboard and the metrics share (a2a_platform/metrics.py) --------

# (family, agent pk, label) -> whole number: what a counter family adds up to over some rows. The
# purge folds the tallies of the rows it deletes into agents.MetricBase; a scrape adds the
# tallies of the rows still stored, so a counter never goes down.
Tallies = dict[tuple[str, int, str], int]

DELIVERIES_FAMILY = "webhook_deliveries"
LATENCY_FAMILY = "webhook_delivery_latency"
# Upper bounds (seconds) of a2a_webhook_delivery_latency_seconds: from a fast receiver's
# answer to a delivery that waited out retries for a day (the retry schedule's reach).
DELIVERY_LATENCY_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
)  # fmt: skip


def latency_label(bound: float) -> str:
    """A latency bucket's label in the tallies: its bound as Prometheus writes `le`."""
    return f"le={bound}"


def attempt_tallies(attempts: QuerySet[DeliveryAttempt]) -> Tallies:
    """Per agent: the recorded attempts by outcome, and the delivered ones' latencies as a
    histogram (cumulative count per bound, sum and count). One grouped scan of the rows."""
    tallies: Tallies = {}
    agent = "delivery__task__agent_id"
    outcomes = {f"o_{o}": Count("id", filter=Q(outcome=o)) for o in AttemptOutcome.values}
    buckets = {
        f"b{i}": Count("id", filter=Q(latency_us__lte=round(bound * 1_000_000)))
        for i, bound in enumerate(DELIVERY_LATENCY_BUCKETS)
    }
    for row in (
        attempts.values(agent)
        .annotate(
            n=Count("id", filter=Q(latency_us__isnull=False)),
            total=Sum("latency_us"),
            **outcomes,
            **buckets,
        )
        .order_by()
    ):
        for outcome in AttemptOutcome.values:
            tallies[(DELIVERIES_FAMILY, row[agent], outcome)] = row[f"o_{outcome}"]
        key = (LATENCY_FAMILY, row[agent])
        for i, bound in enumerate(DELIVERY_LATENCY_BUCKETS):
            tallies[(*key, latency_label(bound))] = row[f"b{i}"]
        tallies[(*key, "count")] = row["n"]
        tallies[(*key, "sum")] = row["total"] or 0  # microseconds: whole numbers add exactly
    return tallies


@dataclass(frozen=True)
class DeliveryBacklog:
    """One agent's deliveries by state now, and the oldest open (pending or sending) and
    held one's creation time."""

    pending: int = 0
    sending: int = 0
    held: int = 0
    dead: int = 0
    oldest_open_at: datetime | None = None
    oldest_held_at: datetime | None = None

    @property
    def queue_depth(self) -> int:
        """Pending and sending: what the pumps have to send."""
        return self.pending + self.sending

    @property
    def owed(self) -> int:
        """Every delivery still owed to a receiver: the queue and the held ones."""
        return self.queue_depth + self.held

    @property
    def oldest_owed_at(self) -> datetime | None:
        times = [t for t in (self.oldest_open_at, self.oldest_held_at) if t is not None]
        return min(times) if times else None


def delivery_backlog() -> dict[int, DeliveryBacklog]:
    """Per agent pk (agents with none owed or dead are absent): one grouped query."""
    states = [DeliveryState.PENDING, DeliveryState.SENDING, DeliveryState.HELD, DeliveryState.DEAD]
    figures: dict[int, dict[str, Any]] = {}
    for row in (
        Delivery.objects.filter(state__in=states)
        .values("task__agent_id", "state")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .order_by()
    ):
        f = figures.setdefault(row["task__agent_id"], {})
        f[row["state"]] = row["n"]
        slot = {
            DeliveryState.PENDING: "oldest_open_at",
            DeliveryState.SENDING: "oldest_open_at",
            DeliveryState.HELD: "oldest_held_at",
        }.get(row["state"])
        if slot is not None and (slot not in f or row["oldest"] < f[slot]):
            f[slot] = row["oldest"]
    return {agent: DeliveryBacklog(**f) for agent, f in figures.items()}


# Why an endpoint is in trouble: its breaker is open (a failure streak: one try in flight at a
# time, webhooks/delivery/endpoint_health.py) or an operator paused it. The dashboard counts
# them; the metrics count them per agent.
ENDPOINT_TROUBLES = {
    "breaker": Q(consecutive_failures__gt=0),
    "paused": Q(paused_at__isnull=False),
}


def troubled_endpoints_per_agent() -> dict[tuple[int, str], int]:
    """(agent pk, reason) -> how many distinct troubled endpoints the agent's push configs
    (not deleted) have a binding to. One grouped query per reason, starting from the
    troubled endpoints (few)."""
    counts = {}
    for reason, q in ENDPOINT_TROUBLES.items():
        for agent, n in (
            PushBinding.objects.filter(
                endpoint__in=Endpoint.objects.filter(q), config__deleted_at__isnull=True
            )
            .values_list("config__task__agent_id")
            .annotate(n=Count("endpoint_id", distinct=True))
            .order_by()
        ):
            counts[(agent, reason)] = n
    return counts


@dataclass(frozen=True)
class RebindProgress:
    """An open rebind with its progress: `done` = moved + finished on the old channel, of
    `planned` moves (one per config; while `rebind.moves_planned` is false the total grows),
    and its live tasks still on the old version."""

    rebind: Rebind
    planned: int
    done: int
    on_old: int
    orphaned: int


def open_rebinds_progress() -> list[RebindProgress]:
    rebinds = list(
        Rebind.objects.filter(state__in=OPEN_REBIND_STATES)
        .select_related("agent")
        .order_by("created_at", "id")
    )
    moves: dict[Any, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    on_old: dict[Any, int] = defaultdict(int)
    if rebinds:
        rows = (
            ChannelMove.objects.filter(rebind__in=[r.pk for r in rebinds])
            .values("rebind_id", "state")
            .annotate(
                n=Count("id"),
                live=Count("id", filter=ChannelMoveQuerySet.on_old_q()),
            )
            .order_by()
        )
        for row in rows:
            moves[row["rebind_id"]][row["state"]] = row["n"]
            on_old[row["rebind_id"]] += row["live"]
    out = []
    for r in rebinds:
        by_state = moves[r.pk]
        out.append(
            RebindProgress(
                rebind=r,
                planned=sum(by_state.values()),
                done=by_state[MoveState.MOVED] + by_state[MoveState.FINISHED_ON_OLD],
                on_old=on_old[r.pk],
                orphaned=by_state[MoveState.ORPHANED],
            )
        )
    return out
