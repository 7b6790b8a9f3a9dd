"""A rebind request and everything checked before a rebind changes anything: the request
an operator makes (command, console, API), its pre-checks (`precheck`), its overlap with an
open rebind (`overlap`), which configs its scope covers (`scope_filter`), and the preview
the console and the API show before anything is written (`rebind_preview`: reads only).
The operations are webhooks/rebinds/operations.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from agents.models import Agent, OnDrainTimeout, PushChannelPolicy
from agents.signing import active_signing_key, published_signing_keys
from tasks.states import TERMINAL_VALUES, TaskState
from webhooks.bindings import credentials_problem, normalize_origin
from webhooks.delivery.ssrf import UnsafeDestination, check_url, parse_url
from webhooks.errors import RebindConflict, RebindInvalid
from webhooks.models import OPEN_REBIND_STATES, MoveState, PushBinding, PushConfig, Rebind


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
    # What the preview does with a new URL the SSRF policy refuses: raise RebindInvalid (the
    # API's preview), or show it as a failed check among the others (the console's wizard).
    # Starting the rebind refuses such a URL either way.
    preview_refuses_unsafe: bool = True


def scope_filter(rebind: Rebind) -> Q:
    """Configs whose current binding is on the old version of this rebind's scope. An
    orphaned config (cut over, waiting for `rebind-orphans`) is in no later rebind's scope:
    it has no channel to announce a move on, and its own new version is where it goes
    (docs/rebinds.md, "Any sequence of operations")."""
    q = Q(
        task__agent_id=rebind.agent_id,
        deleted_at__isnull=True,
        bindings__retired_at__isnull=True,  # its current binding: the one taking writes
    ) & ~Q(moves__state=MoveState.ORPHANED)
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


def checked_abort_reason(reason: str) -> str:
    """Why an abort is asked for, stripped: the one rule every interface's abort obeys (the
    service checks it; the console's confirmation asks it first). Raises RebindInvalid on
    `reason` when there is none, or when it holds a NUL (PostgreSQL refuses it in text)."""
    reason = reason.strip()
    if not reason:
        raise RebindInvalid("reason", "say why the rebind is aborted (a reason is recorded)")
    if "\x00" in reason:
        raise RebindInvalid("reason", "the reason cannot contain a NUL character")
    return reason


def _check_target(url: str, field: str) -> None:
    try:
        check_url(url)
    except UnsafeDestination as exc:
        raise RebindInvalid(field, f"{url}: {exc}") from None


def precheck(req: RebindRequest) -> dict[str, Any]:
    """Everything a rebind needs checked before it changes anything; raises RebindInvalid.
    Resolves DNS for the new URLs: call it outside any transaction."""
    checked = _validated(req)
    for field, url in checked["targets"]:
        _check_target(url, field)
    return checked


def _validated(req: RebindRequest) -> dict[str, Any]:
    """The request's own checks (raises RebindInvalid), and `targets`: each new URL the
    rebind would send to, as (field, url), for the SSRF policy (checked by the caller)."""
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
    targets: list[tuple[str, str]] = []
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
        targets.append(("move_to", req.move_to + sample[len(req.move_from) :]))
    if req.new_url:
        targets.append(("new_url", req.new_url))
    return {
        "policy": policy,
        "on_timeout": on_timeout,
        "deadline": deadline,
        "origin": origin,
        "targets": targets,
    }


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

PASSED, FAILED, FORCED, NOT_NEEDED = "passed", "failed", "forced", "not needed"


@dataclass(frozen=True)
class PreCheck:
    """One pre-check's result as the preview shows it: `check` (what was checked), `result`
    (passed, failed, forced: a failed conflict the request overrides, or not needed: the
    request has nothing for it to check) and `detail` (why, in words)."""

    check: str
    result: str
    detail: str

    @property
    def blocks(self) -> bool:
        return self.result == FAILED


def _ssrf_check(targets: list[tuple[str, str]], *, refuse: bool) -> PreCheck:
    name = "SSRF policy of the new URLs"
    if not targets:
        return PreCheck(name, NOT_NEEDED, "no new URL: every config keeps its own")
    for field, url in targets:
        try:
            check_url(url)
        except UnsafeDestination as exc:
            if refuse:
                raise RebindInvalid(field, f"{url}: {exc}") from None
            return PreCheck(name, FAILED, f"{url}: {exc}")
    return PreCheck(name, PASSED, "; ".join(f"{url}: permitted" for _, url in targets))


def _key_check(req: RebindRequest, overlap_seconds: int) -> PreCheck:
    name = "key published (the new key in the JWKS before it signs)"
    if not req.rotate_key:
        return PreCheck(name, NOT_NEEDED, "no key rotation: the signing keys stay as they are")
    published = [k.kid for k in published_signing_keys(req.agent)]
    active = active_signing_key(req.agent)
    if active is None or active.kid not in published:
        return PreCheck(
            name,
            FAILED,
            f"agent {req.agent.slug!r} has no active signing key in its JWKS: receivers could "
            "verify nothing signed before the new key is active",
        )
    return PreCheck(
        name,
        PASSED,
        f"the JWKS serves {', '.join(published)}; the new key is published there "
        f"{overlap_seconds} s before it signs (at least the card's max-age, "
        f"{req.agent.card_max_age} s), and {active.kid} keeps signing until then",
    )


def _conflict_check(req: RebindRequest) -> tuple[PreCheck, RebindConflict | None]:
    name = "a rebind already open on this scope"
    conflict = open_conflict(replace(req, force=False))
    if conflict is None:
        return PreCheck(name, PASSED, "No open rebind over this scope"), None
    if req.force:
        return PreCheck(name, FORCED, f"{conflict} (forced over it)"), None
    return PreCheck(name, FAILED, str(conflict)), conflict


@dataclass(frozen=True)
class RebindPreview:
    """What starting `request` would do, computed without writing anything: the checks run
    (`checks`, each with its result), the open rebind it would conflict with, and its blast
    radius (configs and endpoints affected, in-flight tasks on the old version by state, the
    first of them listed)."""

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
    checks: tuple[PreCheck, ...] = ()

    @property
    def in_flight(self) -> int:
        return sum(self.in_flight_by_state.values())

    @property
    def startable(self) -> bool:
        """Every pre-check passed (or was not needed, or forced)."""
        return not any(check.blocks for check in self.checks)


def rebind_preview(req: RebindRequest, *, list_limit: int = 50) -> RebindPreview:
    """Run every check `rebind_start` runs and measure what it would touch; raises
    RebindInvalid like it (a new URL the SSRF policy refuses: a failed check in `checks`
    instead, when `req.preview_refuses_unsafe` is False). Writes nothing (the console's
    confirmation page)."""
    checked = _validated(req)
    draft = Rebind(
        agent=req.agent,
        rotate_key=req.rotate_key,
        move_from=req.move_from,
        move_to=req.move_to,
        move_origin=checked["origin"],
        config=req.config,
    )
    overlap = (
        max(req.agent.push_rebind_min_overlap, req.agent.card_max_age) if req.rotate_key else 0
    )
    ssrf_check = _ssrf_check(checked["targets"], refuse=req.preview_refuses_unsafe)
    conflict_check, conflict = _conflict_check(req)
    scope = PushConfig.objects.filter(scope_filter(draft))
    in_flight = scope.exclude(task__state__in=TERMINAL_VALUES)
    by_state = dict(
        in_flight.values_list("task__state").annotate(n=Count("id")).values_list("task__state", "n")
    )
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
        overlap_seconds=overlap,
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
        checks=(ssrf_check, _key_check(req, overlap), conflict_check),
    )
