"""The webhooks app's writes: push configs (the registration gate, check, create as a new
binding version, delete), the outbox hook, operator actions (pause and resume an endpoint,
resolve an alert, replay deliveries; each audited), the sweeper's `delivery_sweep` and the
workers' `worker_register` / `worker_heartbeat`. Reads are in webhooks/selectors.py; claims
and records in webhooks/delivery/claim_record.py.

Each write is one transaction; the operator actions are always the outermost one
(`atomic(durable=True)`), `push_config_create` is not (SendMessage registers its inline
config inside its own transaction). Registration locks the task row, so it serialises with every
lifecycle transition of the task: a transition either committed before (and the snapshot
delivery written here shows its result) or commits after and sees the new binding in its
outbox hook. A registration therefore misses nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from a2a_platform.lib.crypto import decrypt
from a2a_platform.lib.on_commit import send_job
from agents import readiness
from agents.models import Agent, OperatorAction
from tasks.errors import InvalidPayload
from tasks.job_names import SWEEP_DISPATCHES_JOB
from tasks.models import EventKind, Task, TaskEvent
from tasks.services import lock_task
from webhooks.bindings import (
    CheckedConfig,
    binding_create,
    binding_fields,
    body_bytes,
    push_config_check,
    snapshot_delivery,
)
from webhooks.delivery import heads
from webhooks.delivery.bell import ring, ring_on_commit
from webhooks.delivery.maintenance import vacuum_queue_tables
from webhooks.delivery.outbox_store import OutboxEvent, get_outbox_store
from webhooks.errors import PushDeliveryUnavailable, PushNotSupported
from webhooks.models import (
    CONFIG_ID,
    OPEN_DELIVERY_STATES,
    Alert,
    Delivery,
    DeliveryState,
    Endpoint,
    PushBinding,
    PushConfig,
)
from webhooks.rebinds.channel_moves import config_deleted, orphan_reregistered, release_late_held
from webhooks.rebinds.operations import client_rebind, client_rebind_applies
from webhooks.selectors import due_configs


def push_config_gate(
    *, agent: Agent, registering: bool = True, readiness_now: readiness.Readiness | None = None
) -> None:
    """Refuse a push registration that would not be delivered (DESIGN.md invariant 1): for
    good when the operator switched the agent's push notifications off (PushNotSupported),
    with a retry hint while no delivery worker is live (PushDeliveryUnavailable), never
    accepted and dropped. Reading or deleting a config (`registering=False`) promises no
    delivery: only the switch applies.

    Call it before `push_config_check` (no DNS lookup for a refused registration). The
    liveness comes from `readiness_now` when given (an async caller reads it off its ORM
    threads), else from this process's readiness (cached for A2A_READINESS_CACHE_SECONDS)."""
    if not agent.push_notifications_enabled:
        raise PushNotSupported(agent.slug)
    if not registering:
        return
    state = readiness_now or readiness.current()
    if not state.delivery_live:
        raise PushDeliveryUnavailable(retry_after=readiness.RETRY_AFTER_SECONDS)


def push_config_create(
    *, task: Task, config: CheckedConfig | dict[str, Any], issuer: str = ""
) -> PushBinding:
    """Register a webhook for a task: binding version 1, or n+1 for an existing config id.

    One transaction with the task row locked: the binding, its endpoint row, and a snapshot
    delivery (a `task` StreamResponse of the task as it is now). Re-registering an existing
    config id is a rebind of that one task under the agent's declared policy
    (webhooks/rebinds/operations.py, `client_rebind`): under drain, while the task is in flight,
    the new version waits for a channel notice on the old one; otherwise the old version is retired
    at once (it takes no new deliveries, but what it already owes is still delivered
    through it). A dict is checked here first (`push_config_check`, which resolves DNS).
    Raises InvalidPayload (bad or unsafe URL, too many configs), TaskNotFound, and
    PushNotSupported when the agent's push notifications are off (its switch as the locked
    task row reads it). Interfaces call `push_config_gate` first, which also refuses while
    no delivery worker is live.
    """
    checked = config if isinstance(config, CheckedConfig) else push_config_check(config)
    cfg = checked.cfg
    now = timezone.now()
    auth = cfg.authentication if cfg.HasField("authentication") else None

    fields = binding_fields(
        url=cfg.url,
        token=cfg.token,
        auth_scheme=auth.scheme if auth else "",
        credentials=auth.credentials if auth else "",
        issuer=issuer,
    )

    with transaction.atomic():
        task = lock_task(task.pk)
        push_config_gate(agent=task.agent, registering=False)
        config_id = cfg.id or str(uuid.uuid4())
        push = PushConfig.objects.select_for_update().filter(task=task, config_id=config_id).first()
        if push is None or push.deleted_at is not None:
            live = PushConfig.objects.filter(task=task, deleted_at__isnull=True).count()
            if live >= settings.A2A_WEBHOOK_MAX_CONFIGS_PER_TASK:
                raise InvalidPayload(
                    "config",
                    f"a task has at most {settings.A2A_WEBHOOK_MAX_CONFIGS_PER_TASK} push configs",
                )
        if push is not None and client_rebind_applies(task, push):
            binding = client_rebind(task=task, config=push, fields=fields, now=now)
            ring_on_commit()
            return binding
        if push is None:
            push = PushConfig.objects.create(task=task, config_id=config_id, current_version=1)
        else:
            orphan_reregistered(task, push, now)
            push.bindings.filter(retired_at__isnull=True).update(retired_at=now)
            push.current_version += 1
            push.deleted_at = None
            push.save(update_fields=["current_version", "deleted_at"])
        binding = binding_create(config=push, activated_at=now, **fields)
        snapshot_delivery(config=push, binding=binding, task=task, now=now)
        heads.owe([push.pk], now)
        ring_on_commit()
    return binding


def push_config_json(binding: PushBinding) -> dict[str, Any]:
    """A config as the client sees it: credentials are never returned."""
    out: dict[str, Any] = {
        "id": binding.config.config_id,
        "taskId": str(binding.config.task_id),
        "url": binding.url,
    }
    if binding.token_encrypted:
        out["token"] = decrypt(binding.token_encrypted)
    if binding.auth_scheme:
        out["authentication"] = {"scheme": binding.auth_scheme}
    return out


def push_config_delete(*, task: Task, config_id: str) -> None:
    """Delete a config: it takes no new deliveries and what it still owes is canceled (held
    deliveries of a rebind's waiting version too; its move then keeps no rebind open).
    Idempotent: deleting an unknown or deleted config succeeds."""
    if not CONFIG_ID.fullmatch(config_id):  # never stored
        return
    now = timezone.now()
    with transaction.atomic():
        # The task first, then the config, as a registration and a rebind's batch lock them
        # (its orphan mark may change).
        task = lock_task(task.pk)
        push = (
            PushConfig.objects.select_for_update()
            .filter(task=task, config_id=config_id, deleted_at__isnull=True)
            .first()
        )
        if push is None:
            return
        push.deleted_at = now
        push.save(update_fields=["deleted_at"])
        config_deleted(task, push, now)
        push.bindings.filter(retired_at__isnull=True).update(retired_at=now)
        # In-flight ones too: their attempt's outcome is then stale and never re-opens them.
        push.deliveries.filter(state__in=[*OPEN_DELIVERY_STATES, DeliveryState.HELD]).update(
            state=DeliveryState.CANCELED, finished_at=now
        )
        heads.refresh([push.pk])


def deliveries_write_for_events(writes: list[tuple[Task, list[TaskEvent]]]) -> None:
    """Write the deliveries a lifecycle write's task events owe: the outbox hook (registered
    with tasks.hooks by webhooks/apps.py), run inside that write's transaction. One Delivery per
    current binding and event, the events of the writes (one write, or a batch's:
    tasks.hooks.hooks_together) in one outbox write.

    Status and artifact events are delivered; `message` history entries are not (the stream
    shape of spec §3.1.2 has no place for them).
    """
    owed = [
        OutboxEvent(task.pk, event.seq, event.kind, body_bytes(event.payload))
        for task, events in writes
        for event in events
        if event.kind in (EventKind.STATUS, EventKind.ARTIFACT)
    ]
    if owed and get_outbox_store().outbox_write(owed, timezone.now()):
        ring_on_commit()


@transaction.atomic(durable=True)
def endpoint_pause(*, endpoint_pk: int, actor: str, reason: str = "paused by an operator") -> None:
    """A paused endpoint's deliveries wait (they are not tried, nor dead-lettered).
    Audited; the outermost transaction: never inside another."""
    Endpoint.objects.filter(pk=endpoint_pk, paused_at__isnull=True).update(
        paused_at=timezone.now(), paused_reason=reason[:300]
    )
    OperatorAction.record(actor, "pause_endpoint", {"endpoint": endpoint_pk})


@transaction.atomic(durable=True)
def endpoint_resume(*, endpoint_pk: int, actor: str) -> None:
    """Resume an endpoint: a pump claims what waited on it. Audited; the outermost
    transaction: never inside another."""
    Endpoint.objects.filter(pk=endpoint_pk).update(
        paused_at=None, paused_reason="", consecutive_failures=0
    )
    OperatorAction.record(actor, "resume_endpoint", {"endpoint": endpoint_pk})
    waiting = Delivery.objects.filter(
        binding__endpoint_id=endpoint_pk, state__in=OPEN_DELIVERY_STATES
    ).values_list("config_id", flat=True)
    heads.refresh(heads.lock(waiting))  # parked configs are due again
    ring_on_commit()


@transaction.atomic(durable=True)
def alert_resolve(*, alert_pk: int, actor: str) -> bool:
    """Resolve an open alert, audited; an alert already resolved is left as it is (and not
    audited again). True when this call resolved it. The outermost transaction."""
    changed = Alert.objects.filter(pk=alert_pk, resolved_at__isnull=True).update(
        resolved_at=timezone.now()
    )
    if changed:
        OperatorAction.record(actor, "resolve_alert", {"alert": alert_pk})
    return bool(changed)


def delivery_replay(*, delivery_pks: list[int], actor: str) -> int:
    """Re-open the replayable ones of these deliveries (`Delivery.objects.replayable()`: the
    one rule) with the same event id, and audit it. The outermost transaction: never inside
    another."""
    now = timezone.now()
    replayable = Delivery.objects.filter(pk__in=delivery_pks).replayable()
    with transaction.atomic(durable=True):
        config_pks = heads.lock(replayable.values_list("config_id", flat=True))
        rows = list(
            replayable.filter(config_id__in=config_pks)
            .select_for_update(of=("self",))
            .values_list("pk", "event_id")
        )
        # A replay starts a fresh retry schedule (the same event id, so receivers dedupe).
        Delivery.objects.filter(pk__in=[pk for pk, _ in rows]).update(
            state=DeliveryState.PENDING, next_attempt_at=now, finished_at=None, attempts=0
        )
        heads.refresh(config_pks)
        OperatorAction.record(
            actor, "replay_deliveries", {"deliveries": [str(event_id) for _, event_id in rows]}
        )
        if rows:
            ring_on_commit()
    return len(rows)


def delivery_sweep() -> int:
    """The outbox's safety net, run by the beat sweeper: vacuum the queue tables when they
    need it (webhooks/delivery/maintenance.py), repair configs whose head time went missing
    (webhooks/delivery/heads.py), release deliveries held for a binding a rebind activated meanwhile
    (webhooks/rebinds/channel_moves.py), and ring for a pump when a head is due (lost rings, dead
    workers, retries whose hint was lost with its worker; no message when a pump is claiming
    anyway). Returns how many configs were found due (at most one is looked for)."""
    vacuum_queue_tables()
    heads.repair()
    with transaction.atomic():
        release_late_held()
    due = len(due_configs(limit=1))
    if due:
        ring()
    return due


def worker_register(*, hostname: str, queues: list[str]) -> None:
    """Re-enqueue what is due for the queues this worker consumes, then record it for the
    readiness gate (a delivery worker counts only once its backlog was re-enqueued: retries a
    dead worker kept in memory are lost with it, the database still knows them)."""
    reenqueued = True
    if "webhooks" in queues and due_configs(limit=1):
        # A bell left watched by a pump that died with a previous worker must not keep this
        # one back.
        reenqueued = ring(force=True) and reenqueued
    if "agents" in queues or "heartbeat" in queues:
        reenqueued = send_job(SWEEP_DISPATCHES_JOB, []) and reenqueued
    readiness.worker_started(
        hostname=hostname,
        queues=queues,
        backlog_reenqueued=reenqueued,
        hosted=hosted_load_report(queues),
    )


def hosted_load_report(queues: list[str]) -> dict[str, str | None] | None:
    """Per hosted executor of an enabled agent: None when it imports and constructs in this
    process, else why not (readiness keeps an agent's card back until a live worker consuming
    `agents` says its code loads). None for a worker that does not run agents' tasks."""
    if "agents" not in queues:
        return None
    from tasks.executors.hosted import load_check  # imports the a2a-sdk server, on workers only

    return {spec: load_check(spec) for spec in readiness.hosted_specs()}


def worker_heartbeat(*, hostname: str, queues: list[str]) -> bool:
    """Write this worker's beat (with its hosted executors' report: an agent's code fixed or
    newly named is seen within a beat); a worker whose row is missing, or whose start-up
    backlog re-enqueue failed, registers again (`worker_register`) and beats once more. True
    when it registered."""
    hosted = hosted_load_report(queues)
    if readiness.heartbeat(hostname=hostname, hosted=hosted):
        return False
    worker_register(hostname=hostname, queues=queues)
    readiness.heartbeat(hostname=hostname, hosted=hosted)
    return True
