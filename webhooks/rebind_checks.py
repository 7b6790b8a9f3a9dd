"""A rebind request and everything checked before a rebind changes anything: the request
an operator makes (command, console, API), its pre-checks (`precheck`), its overlap with an
open rebind (`overlap`), which configs its scope covers (`scope_filter`), and the preview
the console and the API show before anything is written (`rebind_preview`: reads only).
The operations are webhooks/rebind.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from agents.models import Agent, OnDrainTimeout, PushChannelPolicy
from tasks.states import TERMINAL_STATES, TaskState
from webhooks.bindings import credentials_problem, normalize_origin
from webhooks.errors import RebindConflict, RebindInvalid
from webhooks.models import OPEN_REBIND_STATES, PushBinding, PushConfig, Rebind
from webhooks.ssrf import UnsafeDestination, check_url, parse_url

TERMINAL = [s.value for s in TERMINAL_STATES]


@dataclass(frozen=True)
class RebindRequest:
    """What an operator (command, admin, API) asks for. Scopes combine; at least one."""

    agent: Agent
    rotate_key: bool = False
    move_from: str = ""
    move_to: str = ""
    move_origin: str = ""
    config: PushConfig | None = None
    new_url: str = ""
    # With `config`: its new credentials (None: keep them; "" removes the token).
    new_token: str | None = None
    new_auth_scheme: str | None = None
    new_credentials: str = ""
    policy: str | None = None  # None: the agent's declared policy
    finish_on_old: bool = False
    deadline_seconds: int | None = None  # None: the agent's default
    on_timeout: str | None = None  # None: the agent's declared action
    at: datetime | None = None  # a future start (scheduled), else now
    reason: str = ""
    force: bool = False


def scope_filter(rebind: Rebind) -> Q:
    """Configs whose current binding is on the old version of this rebind's scope."""
    q = Q(
        task__agent_id=rebind.agent_id,
        deleted_at__isnull=True,
        bindings__retired_at__isnull=True,  # its current binding: the one taking writes
    )
    if rebind.config_id:
        q &= Q(pk=rebind.config_id)
    if rebind.move_from and not rebind.rotate_key:
        q &= Q(bindings__url__startswith=rebind.move_from)
        if rebind.move_origin:
            q &= Q(bindings__endpoint__origin=rebind.move_origin)
    return q


# --- pre-checks (before any side effect) -----------------------------------------------------


def checked_seconds(value: int | None, default: int, field: str) -> int:
    seconds = default if value is None else value
    if seconds <= 0:
        raise RebindInvalid(field, "must be a positive number of seconds (in the future)")
    if seconds > settings.A2A_REBIND_MAX_DEADLINE_SECONDS:
        raise RebindInvalid(
            field, f"must be at most {settings.A2A_REBIND_MAX_DEADLINE_SECONDS} seconds"
        )
    return seconds


def _check_target(url: str, field: str) -> None:
    try:
        check_url(url)
    except UnsafeDestination as exc:
        raise RebindInvalid(field, f"{url}: {exc}") from None


def precheck(req: RebindRequest) -> dict[str, Any]:
    """Everything a rebind needs checked before it changes anything; raises RebindInvalid.
    Resolves DNS for the new URLs: call it outside any transaction."""
    policy = req.policy or req.agent.push_rebind_policy
    if policy not in PushChannelPolicy.values:
        raise RebindInvalid("policy", f"must be one of {', '.join(PushChannelPolicy.values)}")
    on_timeout = req.on_timeout or req.agent.push_rebind_on_timeout
    if on_timeout not in OnDrainTimeout.values:
        raise RebindInvalid("on_timeout", f"must be one of {', '.join(OnDrainTimeout.values)}")
    if req.finish_on_old and policy != PushChannelPolicy.DRAIN:
        raise RebindInvalid("finish_on_old", "applies to a drain only")
    deadline = checked_seconds(req.deadline_seconds, req.agent.push_rebind_deadline, "deadline")
    now = timezone.now()
    if req.at is not None and req.at <= now:
        raise RebindInvalid("at", "the start time is in the past")
    if not (req.rotate_key or req.move_from or req.move_to or req.config):
        raise RebindInvalid("scope", "name at least one: rotate the key, move a prefix, a config")
    if not req.agent.push_notifications_enabled and not req.rotate_key:
        raise RebindInvalid("agent", f"agent {req.agent.slug!r} has push notifications off")
    if bool(req.move_from) != bool(req.move_to):
        raise RebindInvalid("move_prefix", "give both the old and the new prefix")
    if req.move_from:
        for field, prefix in (("move_from", req.move_from), ("move_to", req.move_to)):
            parts = urlsplit(prefix)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise RebindInvalid(field, f"{prefix!r} is not an absolute http(s) URL prefix")
        if req.move_from == req.move_to:
            raise RebindInvalid("move_to", "is the same as the old prefix")
    if req.config is not None:
        if req.config.task.agent_id != req.agent.pk or req.config.deleted_at is not None:
            raise RebindInvalid("config", f"agent {req.agent.slug!r} has no such live config")
        if req.new_url:
            try:
                parse_url(req.new_url)
            except UnsafeDestination as exc:
                raise RebindInvalid("new_url", str(exc)) from None
        problem = credentials_problem(
            req.new_token or "", req.new_auth_scheme or "", req.new_credentials
        )
        if problem:
            raise RebindInvalid(f"new_{problem[0]}", problem[1])
    elif req.new_url or req.new_token is not None or req.new_auth_scheme is not None:
        raise RebindInvalid("new_url", "replaces one config's URL or credentials: name the config")
    origin = normalize_origin(req.move_origin) if req.move_origin else ""
    # The configs in scope now, and every origin their moved URLs reach (checked once each).
    live = PushBinding.objects.filter(
        config__task__agent=req.agent,
        config__deleted_at__isnull=True,
        retired_at__isnull=True,
    )
    if req.config is not None:
        live = live.filter(config=req.config)
    if req.move_from:
        matching = live.filter(url__startswith=req.move_from)
        if origin:
            matching = matching.filter(endpoint__origin=origin)
        if not matching.exists():
            raise RebindInvalid(
                "move_from",
                f"{req.move_from!r} matches no push config of agent {req.agent.slug!r}"
                + (f" on {origin}" if origin else ""),
            )
        sample = matching.values_list("url", flat=True).first()
        _check_target(req.move_to + sample[len(req.move_from) :], "move_to")
    if req.new_url:
        _check_target(req.new_url, "new_url")
    return {"policy": policy, "on_timeout": on_timeout, "deadline": deadline, "origin": origin}


def open_conflict(req: RebindRequest) -> RebindConflict | None:
    """The conflict with an open rebind of the agent over the same scope, if any (none when
    forced; a client's own re-registration never conflicts)."""
    if req.force:
        return None
    for other in Rebind.objects.filter(agent=req.agent, state__in=OPEN_REBIND_STATES):
        overlap = None if other.actor.startswith("client") else scope_overlap(other, req)
        if overlap:
            return RebindConflict(other.pk, overlap)
    return None


def scope_overlap(other: Rebind, req: RebindRequest) -> str | None:
    """How `req` overlaps an open rebind of the same agent, if it does."""
    if req.rotate_key and other.rotate_key:
        return "both rotate the signing key"
    if req.config is not None and other.config_id == req.config.pk:
        return "the same config"
    if req.move_from and other.move_from:
        a, b = req.move_from, other.move_from
        if a.startswith(b) or b.startswith(a):
            return f"prefixes {a!r} and {b!r} overlap"
    if (req.rotate_key and (other.move_from or other.config_id)) or (
        other.rotate_key and (req.move_from or req.config)
    ):
        return "one rotates the key of every channel the other moves"
    return None


# --- the preview (reads only) ----------------------------------------------------------------


@dataclass(frozen=True)
class RebindPreview:
    """What starting `request` would do, computed without writing anything: the checks run,
    the open rebind it would conflict with, and its blast radius (configs and endpoints
    affected, in-flight tasks on the old version by state, the first of them listed)."""

    request: RebindRequest
    policy: str
    deadline_seconds: int
    on_timeout: str
    overlap_seconds: int  # how long the next key is published before it signs (0: no rotation)
    conflict: RebindConflict | None
    configs: int
    in_flight_by_state: dict[str, int]
    endpoints: list[str]
    tasks: list[dict[str, Any]]

    @property
    def in_flight(self) -> int:
        return sum(self.in_flight_by_state.values())


def rebind_preview(req: RebindRequest, *, list_limit: int = 50) -> RebindPreview:
    """Run every check `rebind_start` runs and measure what it would touch; raises
    RebindInvalid like it. Writes nothing (the console's confirmation page)."""
    checked = precheck(req)
    draft = Rebind(
        agent=req.agent,
        rotate_key=req.rotate_key,
        move_from=req.move_from,
        move_to=req.move_to,
        move_origin=checked["origin"],
        config=req.config,
    )
    scope = PushConfig.objects.filter(scope_filter(draft))
    in_flight = scope.exclude(task__state__in=TERMINAL)
    by_state = dict(
        in_flight.values_list("task__state").annotate(n=Count("id")).values_list("task__state", "n")
    )
    conflict = open_conflict(req)
    listed = (
        in_flight.select_related("task")
        .order_by("task__created_at", "pk")
        .values_list("task_id", "task__state", "config_id")[:list_limit]
    )
    return RebindPreview(
        request=req,
        policy=checked["policy"],
        deadline_seconds=checked["deadline"],
        on_timeout=checked["on_timeout"],
        overlap_seconds=(
            max(req.agent.push_rebind_min_overlap, req.agent.card_max_age) if req.rotate_key else 0
        ),
        conflict=conflict,
        configs=scope.count(),
        in_flight_by_state={TaskState(s).short: n for s, n in sorted(by_state.items())},
        endpoints=sorted(
            set(
                PushBinding.objects.filter(config__in=scope, retired_at__isnull=True).values_list(
                    "endpoint__origin", flat=True
                )
            )
        ),
        tasks=[
            {"task": str(task), "state": TaskState(state).short, "config": config}
            for task, state, config in listed
        ],
    )
