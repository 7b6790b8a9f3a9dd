"""The readiness gate: may this instance publish its card, and which capabilities can it
honour right now (DESIGN.md invariant 1)?

A card is a readiness artifact. An instance that has never been ready answers the card with
503; it becomes ready when a worker consumes `agents`, a delivery worker has proven itself end
to end (its heartbeat, scheduled by beat on `heartbeat`, reached the database fresh) and has
re-enqueued its due backlog since it started, this process's event hub is connected, and no
migration is pending. Once ready, losing the delivery worker flips `pushNotifications` to false
in the card (new registrations are refused) instead of failing the card.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from a2a_platform.lib.checks import Check, check_broker, check_database, check_migrations
from agents.executor_spec import HOSTED_PREFIX
from agents.hub_state import process_hub_connected
from agents.models import Agent, WebInstance, WorkerHeartbeat

RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class HostedLoad:
    """One hosted executor (`python:<module>:<attribute>`) as the live workers consuming
    `agents` reported it: where it loads, and where it does not with why."""

    spec: str
    agents: tuple[str, ...]  # the enabled agents naming it (slugs)
    loads_on: tuple[str, ...] = ()
    fails_on: tuple[tuple[str, str], ...] = ()  # (worker hostname, reason)

    @property
    def ok(self) -> bool:
        return bool(self.loads_on)

    @property
    def detail(self) -> str:
        if self.loads_on:
            return f"loads on {', '.join(self.loads_on)}"
        if self.fails_on:
            return "no live worker can load it: " + "; ".join(
                f"{host}: {reason}" for host, reason in self.fails_on
            )
        return (
            "no live worker consuming `agents` has reported loading it yet (workers report at "
            "start and with each heartbeat)"
        )

    def as_json(self) -> dict:
        return {
            "ok": self.ok,
            "agents": list(self.agents),
            "loadsOn": list(self.loads_on),
            "failsOn": dict(self.fails_on),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Readiness:
    checks: list[Check]
    delivery_live: bool
    ever_ready: bool
    draining: bool = False
    at: float = field(default_factory=time.monotonic)
    # Per hosted executor of an enabled agent (agent_not_ready): one tenant's code that will
    # not load keeps its own card back, not the instance (/readyz stays 200 for it).
    hosted: dict[str, HostedLoad] = field(default_factory=dict)

    def agent_not_ready(self, agent: Agent) -> str | None:
        """Why this agent's card is refused although the instance serves cards, or None: an
        agent whose executor is hosted is ready only while a live worker consuming `agents`
        reported that its code loads."""
        if not agent.executor.startswith(HOSTED_PREFIX):
            return None
        load = self.hosted.get(agent.executor)
        if load is None:
            return f"{agent.executor}: " + HostedLoad(agent.executor, ()).detail
        return None if load.ok else f"{agent.executor}: {load.detail}"

    @property
    def ready(self) -> bool:
        return not self.draining and all(c.ok for c in self.checks)

    @property
    def card_servable(self) -> bool:
        """Never-ready instances and draining ones answer the card with 503."""
        return not self.draining and (self.ever_ready or self.ready)

    def failing(self) -> dict[str, str]:
        out = {c.name: c.detail for c in self.checks if not c.ok}
        if self.draining:
            out["shutdown"] = "this instance is shutting down"
        return out

    def as_json(self) -> dict:
        return {
            "status": "ready" if self.ready else "not ready",
            "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in self.checks},
            **({"draining": True} if self.draining else {}),
            **({"hosted": {s: h.as_json() for s, h in self.hosted.items()}} if self.hosted else {}),
        }


class _ProcessState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ever_ready = False
        self.draining = False
        self.migrations_ok = False
        self.cached: Readiness | None = None


_state = _ProcessState()


def start_draining() -> None:
    """SIGTERM: turn not-ready first (load balancers stop sending), then drain."""
    _state.draining = True
    _state.cached = None


WORKER_HINT = "`celery -A a2a_platform worker` consumes agents, webhooks and heartbeat"
BEAT_HINT = "beat may be missing: `celery -A a2a_platform beat`"


def _why_not_live(rows: list[WorkerHeartbeat], queue: str, default: str) -> str:
    """Why no worker on `queue` counts as live, in the terms an operator acts on: the queue
    nobody consumes, or the heartbeat that never came (beat missing), before the generic
    stale heartbeat."""
    if not any(queue in r.queues for r in rows):
        return f"no worker consumes `{queue}` ({WORKER_HINT})"
    if not any("heartbeat" in r.queues for r in rows):
        return (
            "no worker consumes `heartbeat`, the queue the heartbeat job goes to, so no worker "
            f"on `{queue}` can prove itself ({WORKER_HINT})"
        )
    if not any(r.beat_at >= r.started_at for r in rows):
        return f"workers started, but no heartbeat has ever arrived: {BEAT_HINT}"
    return default


def _worker_checks() -> tuple[Check, Check, bool, list[WorkerHeartbeat]]:
    fresh_after = timezone.now() - timedelta(seconds=settings.A2A_HEARTBEAT_FRESH_SECONDS)
    # Every registered worker (a handful of rows): the fresh ones decide, the others say why.
    registered = list(WorkerHeartbeat.objects.all())
    rows = [r for r in registered if r.beat_at >= fresh_after]
    agents = [r for r in rows if "agents" in r.queues]
    delivery = [
        r
        for r in rows
        if "webhooks" in r.queues
        and r.backlog_reenqueued_at is not None
        and r.backlog_reenqueued_at >= r.started_at
    ]
    agents_check = Check(
        "agents_worker",
        bool(agents),
        f"{len(agents)} live"
        if agents
        else _why_not_live(
            registered, "agents", "no worker consuming `agents` has a fresh heartbeat"
        ),
    )
    delivery_check = Check(
        "delivery_worker",
        bool(delivery),
        f"{len(delivery)} live"
        if delivery
        else _why_not_live(
            registered,
            "webhooks",
            "no worker consuming `webhooks` has a fresh heartbeat and a re-enqueued backlog",
        ),
    )
    return agents_check, delivery_check, bool(delivery), agents


def hosted_specs() -> list[str]:
    """The hosted executors of the enabled agents: what a worker consuming `agents` checks."""
    return sorted(
        set(
            Agent.objects.filter(enabled=True, executor__startswith=HOSTED_PREFIX).values_list(
                "executor", flat=True
            )
        )
    )


def _hosted_loads(live_agents_workers: list[WorkerHeartbeat]) -> dict[str, HostedLoad]:
    """Each enabled agent's hosted executor, with what the live `agents` workers reported."""
    named: dict[str, list[str]] = {}
    rows = Agent.objects.filter(enabled=True, executor__startswith=HOSTED_PREFIX).order_by("slug")
    for slug, spec in rows.values_list("slug", "executor"):
        named.setdefault(spec, []).append(slug)
    loads = {}
    for spec, slugs in named.items():
        reports = [
            (w.hostname, w.hosted[spec])
            for w in sorted(live_agents_workers, key=lambda w: w.hostname)
            if isinstance(w.hosted, dict) and spec in w.hosted
        ]
        loads[spec] = HostedLoad(
            spec,
            tuple(slugs),
            loads_on=tuple(host for host, reason in reports if reason is None),
            fails_on=tuple((host, str(reason)) for host, reason in reports if reason is not None),
        )
    return loads


def _hub_check() -> Check:
    connected = process_hub_connected()
    return Check("event_hub", connected, "connected" if connected else "not connected")


def compute(*, include_hub: bool = True) -> Readiness:
    """Run every check (database queries; call from a thread)."""
    checks = [check_database()]
    if checks[0].ok:
        if not _state.migrations_ok:
            migrations = check_migrations()
            _state.migrations_ok = migrations.ok
            checks.append(migrations)
        else:
            checks.append(Check("migrations", True, "all applied"))
        agents_check, delivery_check, delivery_live, agents_workers = _worker_checks()
        checks += [agents_check, delivery_check]
        hosted = _hosted_loads(agents_workers)
    else:
        delivery_live, hosted = False, {}
    if include_hub:
        checks.append(_hub_check())
    readiness = Readiness(checks, delivery_live, _state.ever_ready, _state.draining, hosted=hosted)
    if readiness.ready:
        _state.ever_ready = True
    return readiness


def current(*, include_hub: bool = True) -> Readiness:
    """Readiness cached for at most A2A_READINESS_CACHE_SECONDS (the card endpoint asks on
    every request)."""
    cached = _state.cached
    if cached is not None and time.monotonic() - cached.at < settings.A2A_READINESS_CACHE_SECONDS:
        return cached
    with _state.lock:
        cached = _state.cached
        if cached is not None and (
            time.monotonic() - cached.at < settings.A2A_READINESS_CACHE_SECONDS
        ):
            return cached
        readiness = compute(include_hub=include_hub)
        _state.cached = readiness
        return readiness


def instance_name() -> str:
    """This web process's name in its heartbeat row and on the dashboard: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def instance_readiness() -> Readiness:
    """This instance's readiness as /readyz answers it: the gate (`current`) plus the
    broker. The one computation /readyz, the web heartbeat row and the dashboard's readiness
    block share (docs/decisions.md, "The operator console: the dashboard and /readyz"), so
    none of them can call ready what another calls not ready. The card keeps the gate alone:
    a broker outage does not withdraw a card that was served."""
    state = current()
    return dataclasses.replace(state, checks=[*state.checks, check_broker()])


def web_instance_beat(*, name: str, started_at, state: Readiness) -> None:
    """This web process's heartbeat for the dashboard: its readiness now (one upsert), and
    the rows of instances silent for A2A_WEB_INSTANCE_FORGET_SECONDS forgotten."""
    now = timezone.now()
    WebInstance.objects.update_or_create(
        name=name[:255],
        defaults={
            "started_at": started_at,
            "beat_at": now,
            "ready": state.ready,
            "draining": state.draining,
            "failing": state.failing(),
        },
    )
    forget = now - timedelta(seconds=settings.A2A_WEB_INSTANCE_FORGET_SECONDS)
    WebInstance.objects.filter(beat_at__lt=forget).delete()


def cached_or_none() -> Readiness | None:
    cached = _state.cached
    if cached is not None and time.monotonic() - cached.at < settings.A2A_READINESS_CACHE_SECONDS:
        return cached
    return None


# --- capabilities ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Capability:
    """One card capability's value right now, and why."""

    on: bool
    reason: str


def capabilities(
    agent: Agent, readiness: Readiness, *, hub_connected: bool | None = None
) -> dict[str, Capability]:
    """What this instance can honour for this agent right now: the one rule the card and the
    admin both show (DESIGN.md invariant 1).

    `pushNotifications`: the operator's switch and a live delivery worker. `streaming`: the
    operator's switch and a connected event hub. `hub_connected`: the caller's own hub (the
    card reads its event loop's hub); None reads readiness's `event_hub` check (the admin).
    """
    if not agent.push_notifications_enabled:
        push = Capability(False, "switched off by an operator")
    elif not readiness.delivery_live:
        push = Capability(False, "no live delivery worker (see readiness)")
    else:
        push = Capability(True, "a delivery worker is live")
    if not agent.streaming_enabled:
        streaming = Capability(False, "switched off by an operator")
    elif hub_connected is not None:
        streaming = Capability(
            hub_connected, "event hub connected" if hub_connected else "event hub not connected"
        )
    else:
        hub = next((c for c in readiness.checks if c.name == "event_hub"), None)
        streaming = Capability(
            bool(hub and hub.ok), f"event hub {hub.detail}" if hub else "event hub not checked"
        )
    return {"pushNotifications": push, "streaming": streaming}


# --- worker side ------------------------------------------------------------------------------


def worker_started(
    *,
    hostname: str,
    queues: list[str],
    backlog_reenqueued: bool,
    hosted: dict[str, str | None] | None = None,
) -> None:
    """`hosted`: per hosted executor (hosted_specs), None when it loads on this worker, else
    why not (tasks.executors.hosted.load_check); none for a worker not consuming `agents`."""
    now = timezone.now()
    with transaction.atomic():
        WorkerHeartbeat.objects.update_or_create(
            hostname=hostname[:255],
            defaults={
                "queues": sorted(queues),
                "started_at": now,
                "backlog_reenqueued_at": now if backlog_reenqueued else None,
                # Not yet proven end to end: the first heartbeat job sets a fresh beat_at.
                "beat_at": now - timedelta(days=1),
                "hosted": hosted or {},
            },
        )


def heartbeat(*, hostname: str, hosted: dict[str, str | None] | None = None) -> bool:
    """The heartbeat job's write. False when the worker must register (again): its row is
    missing, or its start-up backlog re-enqueue failed (a publish error), without which it
    would never count as a delivery worker until restarted. Its beat is written either way,
    with its hosted executors' report when given (worker_started)."""
    now = timezone.now()
    beat = {"beat_at": now} if hosted is None else {"beat_at": now, "hosted": hosted}
    rows = WorkerHeartbeat.objects.filter(hostname=hostname[:255])
    if rows.filter(backlog_reenqueued_at__isnull=False).update(**beat):
        return True
    rows.update(**beat)
    return False


def instance_checks(state: Readiness) -> list[Check]:
    """Every check an operator sees for this instance (the dashboard and the metrics'
    `a2a_readiness`), from `instance_readiness()`: its checks (the gate's and the broker's)
    and one per hosted executor of an enabled agent (failing keeps only those agents' cards
    back)."""
    checks = list(state.checks)
    checks += [
        Check(f"hosted {spec}", load.ok, f"agents {', '.join(load.agents)}: {load.detail}")
        for spec, load in state.hosted.items()
    ]
    return checks


def heartbeat_fresh(worker: WorkerHeartbeat, now=None) -> bool:
    """The worker's last heartbeat is within A2A_HEARTBEAT_FRESH_SECONDS."""
    now = now or timezone.now()
    return (now - worker.beat_at).total_seconds() <= settings.A2A_HEARTBEAT_FRESH_SECONDS


def worker_liveness(now) -> list[tuple[WorkerHeartbeat, bool]]:
    """Every registered worker with whether its heartbeat is fresh, by hostname."""
    return [(w, heartbeat_fresh(w, now)) for w in WorkerHeartbeat.objects.order_by("hostname")]
