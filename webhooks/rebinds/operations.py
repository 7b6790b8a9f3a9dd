"""Rebinds: moving an agent's push channels (signing key, URLs, credentials) while tasks are
in flight, in two phases, audited (DESIGN.md invariant 3; docs/rebinds.md).

    start ──▶ preparing: the new key is published in the JWKS, not signing, for the minimum
              overlap (at least the card's max-age), so receivers can learn it first
          ──▶ draining: the new key signs (the old one too, until it retires); each in-flight
              config gets a new binding version and a channel-changed notice on its old one;
              the config moves when the notice is delivered (webhooks/rebinds/channel_moves.py)
          ──▶ completed when no in-flight task is left on an old version; the old key retires
              after the last old delivery plus the retry horizon plus the signature tolerance
    or    ──▶ cut over (policy cutover, the deadline action, or an operator): what is left on
              the old versions is orphaned, each config with a final notice on the old channel

The request and every check made before anything changes (and the console's preview) are
webhooks/rebinds/checks.py. One service per transition, each one transaction (durable: never
inside a caller's) with its OperatorAction row; `rebind_advance` is the idempotent step the
beat monitor, the `rebind` command and the services themselves run: whatever a crash
interrupted, it finishes.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from a2a_platform.lib import crypto
from agents.models import (
    Agent,
    OnDrainTimeout,
    OperatorAction,
    PushChannelPolicy,
    SigningKey,
    SigningKeyState,
)
from agents.signing import (
    live_signing_keys,
    signing_key_activate,
    signing_key_publish,
    signing_key_withdraw,
)
from tasks.models import Task
from tasks.states import TERMINAL_STATES, TERMINAL_VALUES
from webhooks.alerts import alert_raise
from webhooks.bindings import copied_fields, normalize_origin
from webhooks.delivery import heads, notices
from webhooks.delivery.bell import ring_on_commit
from webhooks.errors import NoticeIncomplete, RebindInvalid, RebindNotFound
from webhooks.models import (
    OPEN_DELIVERY_STATES,
    OPEN_REBIND_STATES,
    Alert,
    AlertKind,
    ChannelMove,
    Delivery,
    DeliveryState,
    MoveState,
    PushBinding,
    PushConfig,
    Rebind,
    RebindState,
)
from webhooks.rebinds import channel_moves
from webhooks.rebinds import machine as rebind_machine
from webhooks.rebinds.channel_moves import Channels
from webhooks.rebinds.checks import (
    RebindRequest,
    checked_abort_reason,
    checked_seconds,
    open_conflict,
    precheck,
    scope_filter,
)
from webhooks.selectors import rebind_counts

logger = logging.getLogger(__name__)

MONITOR_ACTOR = "system:rebind-monitor"


# --- reading a rebind's scope ----------------------------------------------------------------


def _moving_url(rebind: Rebind, url: str) -> str:
    """Where a binding at `url` goes in this rebind (unchanged when out of the move's scope)."""
    if rebind.config_id and rebind.new_url:
        return rebind.new_url
    in_origin = not rebind.move_origin or normalize_origin(url) == rebind.move_origin
    if rebind.move_from and url.startswith(rebind.move_from) and in_origin:
        return rebind.move_to + url[len(rebind.move_from) :]
    return url


def _new_fields(rebind: Rebind):
    """Where and how each config goes in this rebind: `new_fields(old binding)`."""

    def fields(old: PushBinding) -> dict[str, Any]:
        url = _moving_url(rebind, old.url)
        if rebind.config_id and rebind.replaces_credentials:
            return {
                **copied_fields(old, url=url),
                "token_encrypted": rebind.new_token_encrypted,
                "auth_scheme": rebind.new_auth_scheme,
                "credentials_encrypted": rebind.new_credentials_encrypted,
            }
        return copied_fields(old, url=url)

    return fields


def _channels(rebind: Rebind) -> Channels:
    old = [rebind.old_key.kid] if rebind.old_key_id and rebind.old_key else []
    live = [k.kid for k in live_signing_keys(rebind.agent) if k.state == SigningKeyState.ACTIVE]
    if not rebind.rotate_key:
        old = live
    return Channels(
        rebind_pk=rebind.pk,
        policy=rebind.policy,
        old_key_ids=old,
        new_key_ids=live,
        new_prefix=rebind.move_to if rebind.move_from else "",
    )


def _touch_agent(agent_pk: int) -> None:
    """The card (its push-channel extension) and its ETag change with every rebind step."""
    Agent.objects.filter(pk=agent_pk).update(updated_at=timezone.now())


def _rebind_pk(pk: object) -> uuid.UUID:
    """A rebind id as given (command line, admin, API): RebindNotFound when malformed."""
    try:
        return pk if isinstance(pk, uuid.UUID) else uuid.UUID(str(pk))
    except ValueError:
        raise RebindNotFound(pk) from None


def rebind_get(pk: object) -> Rebind:
    """The rebind with this id (as given); RebindNotFound."""
    rebind = Rebind.objects.select_related("agent").filter(pk=_rebind_pk(pk)).first()
    if rebind is None:
        raise RebindNotFound(pk)
    return rebind


def _lock(pk: object) -> Rebind:
    """The rebind row locked (not its agent's: a select_for_update over the join would lock
    the agent row too, and every write that inserts a row naming the agent, a SendMessage's
    task or receipt, would then wait at its commit's key check while this transaction waits
    for that write's task: a deadlock). FOR NO KEY UPDATE, as an UPDATE of it takes: it
    serialises the rebind's operations without blocking those key checks."""
    rebind = (
        Rebind.objects.select_for_update(of=("self",), no_key=True)
        .select_related("agent")
        .filter(pk=_rebind_pk(pk))
        .first()
    )
    if rebind is None:
        raise RebindNotFound(pk)
    return rebind


def _record(rebind: Rebind, actor: str, action: str, **extra: Any) -> None:
    OperatorAction.record(
        actor, f"rebind_{action}", {"rebind": str(rebind.pk), "agent": rebind.agent.slug, **extra}
    )


# --- the operations --------------------------------------------------------------------------


def rebind_start(req: RebindRequest, *, actor: str) -> Rebind:
    """Open a rebind: pre-check everything, then (one transaction, the agent row locked, so
    two rebinds over the same scope cannot both open) write the Rebind row and, for a start
    now, publish the new key. Then advance it as far as it can go at once: a rebind without
    a key rotation is draining (or cut over) on return. Raises RebindInvalid, RebindConflict."""
    checked = precheck(req)
    now = timezone.now()
    with transaction.atomic(durable=True):
        # FOR NO KEY UPDATE: it serialises rebind starts per agent without blocking the key
        # checks of rows that name the agent (a SendMessage's task and receipt).
        agent = Agent.objects.select_for_update(no_key=True).get(pk=req.agent.pk)
        conflict = open_conflict(req)
        if conflict is not None:
            raise conflict
        rebind = Rebind.objects.create(
            agent=agent,
            rotate_key=req.rotate_key,
            move_from=req.move_from,
            move_to=req.move_to,
            move_origin=checked["origin"],
            config=req.config,
            new_url=req.new_url,
            new_token_encrypted=crypto.encrypt(req.new_token) if req.new_token else "",
            new_auth_scheme=req.new_auth_scheme or "",
            new_credentials_encrypted=(
                crypto.encrypt(req.new_credentials) if req.new_credentials else ""
            ),
            replaces_credentials=req.new_token is not None or req.new_auth_scheme is not None,
            policy=checked["policy"],
            finish_on_old=req.finish_on_old,
            deadline_seconds=checked["deadline"],
            on_timeout=checked["on_timeout"],
            actor=actor[:150],
            reason=req.reason[:500],
            forced=req.force,
            state=RebindState.SCHEDULED if req.at else RebindState.PREPARING,
            scheduled_for=req.at,
        )
        if req.at:
            _schedule_clocked(rebind)
        else:
            _prepare(rebind, agent, now)
        _record(rebind, actor, "schedule" if req.at else "start", policy=rebind.policy)
        _touch_agent(agent.pk)
    logger.info("rebind.opened", extra={"rebind": str(rebind.pk), "agent": agent.slug})
    return rebind_advance(rebind.pk)


def _prepare(rebind: Rebind, agent: Agent, now: datetime) -> None:
    rebind.started_at = now
    if rebind.rotate_key:
        rebind.old_key = SigningKey.objects.filter(
            agent=agent, state=SigningKeyState.ACTIVE
        ).first()
        rebind.new_key = signing_key_publish(agent)
        overlap = max(agent.push_rebind_min_overlap, agent.card_max_age)
        rebind.activate_key_at = now + timedelta(seconds=overlap)
    else:
        rebind.activate_key_at = now
    rebind.save(update_fields=["started_at", "old_key", "new_key", "activate_key_at"])


def _schedule_clocked(rebind: Rebind) -> None:
    """One one-off django-celery-beat ClockedSchedule per rebind, with no `expires` (an
    expired message would be dropped unseen under backlog); the monitor is the backstop."""
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    from webhooks.job_names import REBIND_FIRE_JOB

    clock = ClockedSchedule.objects.create(clocked_time=rebind.scheduled_for)
    PeriodicTask.objects.create(
        name=f"rebind {rebind.pk}",
        task=REBIND_FIRE_JOB,
        clocked=clock,
        one_off=True,
        args=f'["{rebind.pk}"]',
        queue="heartbeat",
        description=f"starts rebind {rebind.pk} of {rebind.agent.slug}",
    )


def _unschedule(rebind: Rebind) -> None:
    from django_celery_beat.models import ClockedSchedule, PeriodicTask

    tasks = PeriodicTask.objects.filter(name=f"rebind {rebind.pk}")
    clocks = list(tasks.values_list("clocked_id", flat=True))
    tasks.delete()
    ClockedSchedule.objects.filter(pk__in=[c for c in clocks if c]).delete()


def client_rebind_applies(task: Task, config: PushConfig) -> bool:
    """Whether a client re-registering `config` (same id) is announced on its old channel
    (`client_rebind`): when the config is live, took deliveries on a version its receiver
    trusts, and a notice can name the agent's JWKS. Otherwise the new version takes over at
    once, unannounced: for a deleted config (the client chose a new channel itself) or an
    orphaned one (its old channel was cut over: its receiver was told it is orphaned)."""
    if (
        config.deleted_at is not None
        or config.moves.filter(state=MoveState.ORPHANED).exists()  # no channel to tell
    ):
        return False
    old = config.bindings.filter(activated_at__isnull=False).order_by("-version").first()
    return old is not None and bool(channel_moves.jwks_url_of(old, task.agent))


def client_rebind(
    *, task: Task, config: PushConfig, fields: dict[str, Any], now: datetime
) -> PushBinding:
    """The client re-registered `config` (same id): a one-config rebind, inside the
    registration's transaction (task and config locked), announced by a channel-changed
    notice on the old version. Under the drain policy, while the task is in flight, the new
    version opens with a held snapshot released when the notice is delivered. Under the
    cutover policy, or for a finished task (nothing more to hold), it takes over at once: the
    notice still goes first (a config's deliveries go in order), then the snapshot."""
    agent = task.agent
    at_once = (
        agent.push_rebind_policy != PushChannelPolicy.DRAIN or task.task_state in TERMINAL_STATES
    )
    policy = PushChannelPolicy.CUTOVER if at_once else PushChannelPolicy.DRAIN
    rebind = Rebind.objects.create(
        agent=agent,
        config=config,
        policy=policy,
        deadline_seconds=agent.push_rebind_deadline,
        deadline=now + timedelta(seconds=agent.push_rebind_deadline),
        on_timeout=agent.push_rebind_on_timeout,
        actor=f"client {task.owner}"[:150],
        reason="the client re-registered the config",
        state=RebindState.COMPLETED if at_once else RebindState.DRAINING,
        started_at=now,
        finished_at=now if at_once else None,
        activate_key_at=now,
        cutoff=now,
        moves_planned=True,
    )
    keys = [k.kid for k in live_signing_keys(agent) if k.state == SigningKeyState.ACTIVE]
    [move] = channel_moves.move_configs(
        rebind_pk=rebind.pk,
        items=[(task, config)],
        new_fields=lambda old: fields,
        channels=Channels(rebind.pk, rebind.policy, keys, keys),
        now=now,
        snapshot=True,
    )
    if at_once:
        notices.activate([move.pk], now)
    rebind.client_binding = move.new_binding
    rebind.save(update_fields=["client_binding"])
    if at_once:
        _refresh_counts(rebind)
    OperatorAction.record(
        rebind.actor, "rebind_client", {"rebind": str(rebind.pk), "config": config.config_id}
    )
    return move.new_binding


def rebind_fire(pk: object) -> Rebind:
    """The clocked job: start a scheduled rebind whose time has come (idempotent)."""
    return rebind_advance(pk)


def rebind_advance(pk: object) -> Rebind:
    """Take one rebind as far as it can go now (idempotent; every step its own transaction,
    so a crash anywhere leaves a state the next call continues from): start a scheduled one
    whose time came, activate the published key after the overlap, plan the moves in
    batches, settle finished-on-old moves, complete, raise deadline alerts and run the
    deadline action, refresh the counts, and retire the old key when its time came."""
    now = timezone.now()
    rebind = rebind_get(pk)
    pk = rebind.pk
    if rebind.state == RebindState.SCHEDULED and rebind.scheduled_for <= now:
        with transaction.atomic(durable=True):
            rebind = _lock(pk)
            if rebind.state == RebindState.SCHEDULED:
                rebind.state = rebind_machine.check("start", rebind.state)
                rebind.save(update_fields=["state"])
                _prepare(rebind, rebind.agent, now)
                _record(rebind, MONITOR_ACTOR, "fire")
                _touch_agent(rebind.agent_id)
    if rebind.state == RebindState.PREPARING and rebind.activate_key_at <= now:
        _begin(rebind.pk)
        rebind = rebind_get(pk)
    if rebind.state in (RebindState.DRAINING, RebindState.CUT_OVER) and not rebind.moves_planned:
        if not _plan_all(rebind.pk):
            return rebind_get(pk)
        rebind = rebind_get(pk)
    if rebind.state == RebindState.DRAINING:
        _settle_finished_on_old(rebind)
        _drain_step(rebind.pk)
        rebind = rebind_get(pk)
        _dead_notice_alert(rebind)
    _refresh_counts(rebind)
    _retire_old_key_when_due(rebind)
    return rebind_get(pk)


def _plan_all(pk: object) -> bool:
    """Plan every batch. A notice that cannot be made complete (NoticeIncomplete) is never
    sent: the rebind is aborted with that reason (its batch rolled back), and False is
    returned."""
    try:
        while not _plan_batch(pk):
            pass
    except NoticeIncomplete as exc:
        logger.warning("rebind.notice_incomplete", extra={"rebind": str(pk), "why": str(exc)})
        rebind_abort(pk, actor=MONITOR_ACTOR, reason=str(exc))
        return False
    return True


def _dead_notice_alert(rebind: Rebind) -> None:
    """One `rebind_notice_dead` alert per rebind while any of its notices is dead-lettered
    (its task stays on the old version until an operator replays the notice, moves it, or
    cuts over), naming the tasks; updated only when that list changes, resolved once none is
    dead."""
    dead = list(
        ChannelMove.objects.filter(rebind=rebind)
        .notice_dead()
        .order_by("id")
        .values_list("task_id", flat=True)
    )
    open_alert = Alert.objects.filter(
        kind=AlertKind.REBIND_NOTICE_DEAD, rebind=rebind, resolved_at__isnull=True
    ).first()
    if not dead:
        if open_alert is not None:
            Alert.objects.filter(pk=open_alert.pk).update(resolved_at=timezone.now())
        return
    more = f" and {len(dead) - 5} more" if len(dead) > 5 else ""
    shown = ", ".join(str(t) for t in dead[:5]) + more
    message = (
        f"rebind {rebind.pk} of {rebind.agent.slug}: {len(dead)} notice(s) dead-lettered, "
        f"task(s) still on the old channel: {shown}; replay the notice, move now or cut over"
    )
    if open_alert is None or open_alert.message != message[:500]:
        alert_raise(AlertKind.REBIND_NOTICE_DEAD, None, message, rebind=rebind)


def _begin(pk: object) -> None:
    """preparing → draining (or → cut over): the new key signs, the old version is fixed by
    the cutoff, and new registrations are on the new version from now on."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        if rebind.state != RebindState.PREPARING:
            return
        operation = "drain" if rebind.policy == PushChannelPolicy.DRAIN else "cut_over"
        rebind.state = rebind_machine.check(operation, rebind.state)
        if rebind.new_key_id:
            previous = signing_key_activate(rebind.new_key)
            rebind.old_key = previous or rebind.old_key
        rebind.cutoff = now
        rebind.deadline = now + timedelta(seconds=rebind.deadline_seconds)
        if rebind.state == RebindState.CUT_OVER:
            rebind.finished_at = now
        rebind.save(update_fields=["state", "old_key", "cutoff", "deadline", "finished_at"])
        _record(rebind, rebind.actor, "drain" if operation == "drain" else "cut_over")
        _touch_agent(rebind.agent_id)


def _plan_batch(pk: object) -> bool:
    """Move the next batch of old-version configs (one transaction, tasks then configs
    locked in id order, so each serialises with the task's transitions). True when nothing
    was left to plan."""
    now = timezone.now()
    size = settings.A2A_REBIND_BATCH
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        if rebind.moves_planned or rebind.state not in (
            RebindState.DRAINING,
            RebindState.CUT_OVER,
        ):
            return True
        candidates = list(
            # One filter call: the cutoff is on the same (current) binding the scope matched; a
            # second .filter() would join every binding again (a config with two rows twice).
            PushConfig.objects.filter(
                scope_filter(rebind) & Q(bindings__created_at__lte=rebind.cutoff)
            )
            .exclude(task__state__in=TERMINAL_VALUES)
            .exclude(moves__rebind=rebind)
            .filter(pk__gt=rebind.plan_cursor)  # keyset: each batch reads only its own
            .order_by("pk")
            .values_list("pk", "task_id")[:size]
        )
        if not candidates:
            rebind.moves_planned = True
            rebind.save(update_fields=["moves_planned"])
            return True
        task_pks = sorted({task for _, task in candidates})
        tasks = {
            t.pk: t
            for t in Task.objects.select_for_update(of=("self",))
            .select_related("agent")
            .filter(pk__in=task_pks)
            .order_by("pk")
        }
        configs = {
            c.pk: c
            for c in PushConfig.objects.select_for_update()
            .filter(pk__in=[pk for pk, _ in candidates])
            .order_by("pk")
        }
        moving, staying = [], []
        for config_pk, task_pk in candidates:
            task, config = tasks[task_pk], configs[config_pk]
            if task.task_state in TERMINAL_STATES or config.deleted_at is not None:
                staying.append((task, config, MoveState.FINISHED_ON_OLD))
            elif rebind.finish_on_old:
                staying.append((task, config, MoveState.FINISHING_ON_OLD))
            else:
                moving.append((task, config))
        if staying:
            current = {
                b.config_id: b
                for b in PushBinding.objects.filter(
                    config_id__in=[c.pk for _, c, _ in staying],
                    retired_at__isnull=True,
                )
            }
            ChannelMove.objects.bulk_create(
                ChannelMove(
                    rebind=rebind,
                    config=config,
                    task=task,
                    old_binding=current[config.pk],
                    state=state,
                    finished_at=now if state == MoveState.FINISHED_ON_OLD else None,
                )
                for task, config, state in staying
            )
        channel_moves.move_configs(
            rebind_pk=rebind.pk,
            items=moving,
            new_fields=_new_fields(rebind),
            channels=_channels(rebind),
            now=now,
            orphan=rebind.state == RebindState.CUT_OVER,
        )
        rebind.plan_cursor = max(pk for pk, _ in candidates)
        rebind.save(update_fields=["plan_cursor"])
        ring_on_commit()
    return False


def _settle_finished_on_old(rebind: Rebind) -> None:
    """Finishing-on-old moves whose task is terminal and whose old binding owes nothing."""
    now = timezone.now()
    done = (
        ChannelMove.objects.filter(rebind=rebind, state=MoveState.FINISHING_ON_OLD)
        .filter(task__state__in=TERMINAL_VALUES)
        .exclude(
            old_binding__deliveries__state__in=OPEN_DELIVERY_STATES,
        )
    )
    ChannelMove.objects.filter(pk__in=list(done.values_list("pk", flat=True))).update(
        state=MoveState.FINISHED_ON_OLD, finished_at=now
    )


def _drain_step(pk: object) -> None:
    """Complete the drain when nothing is left on the old version; else alert at 50, 90 and
    100 % of the deadline, and at the deadline extend once or cut over."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        if rebind.state != RebindState.DRAINING or not rebind.moves_planned:
            return
        remaining = ChannelMove.objects.filter(rebind=rebind).keeping_drain_open().count()
        if remaining == 0:
            rebind.state = rebind_machine.check("complete", rebind.state)
            rebind.finished_at = now
            if rebind.old_key_id:
                rebind.old_key_retire_after = now + timedelta(seconds=retire_margin())
            rebind.save(update_fields=["state", "finished_at", "old_key_retire_after"])
            _record(rebind, MONITOR_ACTOR, "complete")
            _refresh_counts(rebind)
            _touch_agent(rebind.agent_id)
            return
        total = (rebind.deadline - rebind.cutoff).total_seconds()
        threshold = rebind_machine.alert_threshold(
            (now - rebind.cutoff).total_seconds(), total, rebind.alerted_percent
        )
        if threshold:
            rebind.alerted_percent = threshold
            rebind.save(update_fields=["alerted_percent"])
            alert_raise(
                AlertKind.REBIND_DEADLINE,
                None,
                f"rebind {rebind.pk} of {rebind.agent.slug}: {threshold}% of its deadline used, "
                f"{remaining} task(s) still on the old channel",
                rebind=rebind,
            )
        if now < rebind.deadline:
            return
        if rebind.on_timeout == OnDrainTimeout.EXTEND and rebind.extended_at is None:
            _extend(rebind, rebind.deadline_seconds, MONITOR_ACTOR, now)
            alert_raise(
                AlertKind.REBIND_DEADLINE,
                None,
                f"rebind {rebind.pk} of {rebind.agent.slug}: deadline reached with {remaining} "
                f"task(s) on the old channel; extended once, to {rebind.deadline:%Y-%m-%d %H:%M}",
                rebind=rebind,
            )
            return
        _cut_over(rebind, MONITOR_ACTOR, now, why="deadline reached")


def retire_margin() -> float:
    """How long an old key outlives the last delivery on its version: the longest retry
    horizon (a retry signed just before could still be in flight) plus the signature
    tolerance receivers allow."""
    schedules = (settings.A2A_WEBHOOK_RETRY_SCHEDULE, settings.A2A_WEBHOOK_AUTH_RETRY_SCHEDULE)
    horizon = max(sum(float(s) for s in schedule) for schedule in schedules)
    return horizon + settings.A2A_WEBHOOK_SIGNATURE_TOLERANCE_SECONDS


def _extend(rebind: Rebind, seconds: int, actor: str, now: datetime) -> None:
    rebind_machine.check("extend", rebind.state)
    rebind.deadline = max(rebind.deadline, now) + timedelta(seconds=seconds)
    rebind.extended_at = now
    rebind.alerted_percent = 0
    rebind.save(update_fields=["deadline", "extended_at", "alerted_percent"])
    _record(rebind, actor, "extend", seconds=seconds)
    _touch_agent(rebind.agent_id)


def _locked_moves(moves) -> list[ChannelMove]:
    """The moves with their tasks, then their configs, locked in id order (as a
    registration and the lifecycle lock them) and attached fresh as the locks read them."""
    rows = list(moves)
    tasks = {
        t.pk: t
        for t in Task.objects.select_for_update(of=("self",))
        .select_related("agent")
        .filter(pk__in=sorted({m.task_id for m in rows}))
        .order_by("pk")
    }
    configs = {
        c.pk: c
        for c in PushConfig.objects.select_for_update()
        .filter(pk__in=sorted({m.config_id for m in rows}))
        .order_by("pk")
    }
    for move in rows:
        move.task, move.config = tasks[move.task_id], configs[move.config_id]
    return rows


def _cut_over(rebind: Rebind, actor: str, now: datetime, *, why: str) -> int:
    """Orphan every move still on the old version (task and config rows locked in id order);
    the rebind is cut over. Returns how many were orphaned."""
    rebind.state = rebind_machine.check("cut_over", rebind.state)
    left = _locked_moves(
        ChannelMove.objects.filter(rebind=rebind)
        .keeping_drain_open()
        .select_related("old_binding", "new_binding")
    )
    tasks = {m.task_id: m.task for m in left}
    channels = _channels(rebind)
    for move in left:
        if tasks[move.task_id].task_state in TERMINAL_STATES and move.notice_id is None:
            continue
        channel_moves.orphan_move(
            move,
            task=tasks[move.task_id],
            new_fields=_new_fields(rebind),
            channels=Channels(**{**channels.__dict__, "policy": PushChannelPolicy.CUTOVER}),
            now=now,
        )
    rebind.finished_at = now
    rebind.save(update_fields=["state", "finished_at"])
    _record(rebind, actor, "cut_over", why=why, orphaned=len(left))
    _refresh_counts(rebind)
    _touch_agent(rebind.agent_id)
    ring_on_commit()
    return len(left)


def rebind_cutover(pk: object, *, actor: str) -> Rebind:
    """Cut over now: what is still on the old version is orphaned, each with a final
    notice on its old channel. A rebind still preparing activates its key first."""
    rebind = rebind_get(pk)
    pk = rebind.pk
    rebind_machine.check("cut_over", rebind.state)
    if rebind.state == RebindState.PREPARING:
        with transaction.atomic(durable=True):
            rebind = _lock(pk)
            rebind_machine.check("cut_over", rebind.state)
            rebind.policy, rebind.activate_key_at = PushChannelPolicy.CUTOVER, timezone.now()
            rebind.save(update_fields=["policy", "activate_key_at"])
            _record(rebind, actor, "cut_over_requested")
        return rebind_advance(pk)
    if not _plan_all(pk):
        return rebind_get(pk)
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        _cut_over(rebind, actor, timezone.now(), why="an operator cut it over")
    return rebind_advance(pk)


def rebind_extend(pk: object, *, seconds: int, actor: str) -> Rebind:
    """Push a draining rebind's deadline back by `seconds` (its alerts start over)."""
    seconds = checked_seconds(seconds, seconds, "seconds")
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        _extend(rebind, seconds, actor, timezone.now())
    return rebind_advance(pk)


def rebind_abort(pk: object, *, actor: str, reason: str) -> Rebind:
    """Stop a rebind, saying why: an abort without a reason is refused (RebindInvalid on
    `reason`, `checks.checked_abort_reason`), whoever asks (console, command, API).
    Scheduled: its clocked job is removed. Preparing: the published key is withdrawn.
    Draining: configs already moved stay moved; the others stay on (or return to) their old
    version: their notices still open are withdrawn, their waiting new binding retired unused,
    and what was held for it goes to the old binding instead (never sent). A new key that
    already signs stays active (undoing that is another rotation)."""
    reason = checked_abort_reason(reason)
    now = timezone.now()
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        was = rebind.state
        rebind.state = rebind_machine.check("abort", rebind.state)
        if was == RebindState.SCHEDULED:
            _unschedule(rebind)
        if was == RebindState.PREPARING and rebind.new_key_id:
            signing_key_withdraw(rebind.new_key_id)
        if was == RebindState.DRAINING:
            _revert_pending(rebind, now)
            if rebind.old_key_id:
                rebind.old_key_retire_after = now + timedelta(seconds=retire_margin())
        rebind.finished_at = now
        aborted = f"aborted: {reason}"
        rebind.reason = (f"{rebind.reason} | {aborted}" if rebind.reason else aborted)[:500]
        rebind.save(update_fields=["state", "finished_at", "reason", "old_key_retire_after"])
        _record(rebind, actor, "abort", was=was, reason=reason)
        _refresh_counts(rebind)
        _touch_agent(rebind.agent_id)
        ring_on_commit()
    return rebind_advance(pk)


def _revert_pending(
    rebind: Rebind,
    now: datetime,
    *,
    move_pks: list[int] | None = None,
    to_state: str = MoveState.REVERTED,
    reason: str = "aborted",
) -> int:
    """Return moves still waiting for their notice to their old version: the notice
    withdrawn if still open, the waiting binding retired unused, what was held for it
    pinned to the old binding instead (it was never sent), the old binding taking writes
    again. Returns how many."""
    pending = ChannelMove.objects.filter(rebind=rebind, state=MoveState.NOTICE_PENDING)
    if move_pks is not None:
        pending = pending.filter(pk__in=move_pks)
    pending = _locked_moves(pending.select_related("old_binding", "new_binding"))
    config_pks = sorted({m.config_id for m in pending})
    for move in pending:
        if move.notice_id:
            Delivery.objects.filter(pk=move.notice_id, state__in=OPEN_DELIVERY_STATES).update(
                state=DeliveryState.SUPERSEDED,
                last_error=f"rebind {rebind.pk} {reason}",
                finished_at=now,
            )
        if move.new_binding is not None:
            PushBinding.objects.filter(pk=move.new_binding_id).update(retired_at=now)
            Delivery.objects.filter(binding=move.new_binding, state=DeliveryState.HELD).update(
                binding=move.old_binding, state=DeliveryState.PENDING, next_attempt_at=now
            )
        PushBinding.objects.filter(pk=move.old_binding_id).update(retired_at=None)
        move.state = to_state
        move.finished_at = now if to_state == MoveState.REVERTED else None
        move.new_binding = None if to_state == MoveState.FINISHING_ON_OLD else move.new_binding
        move.save(update_fields=["state", "finished_at", "new_binding"])
    heads.refresh(config_pks)
    return len(pending)


def rebind_moves_finish_on_old(pk: object, *, move_pks: list[int], actor: str) -> int:
    """Let these tasks finish on their old version (a draining rebind's moves still waiting
    for their notice): their notice is withdrawn and they stay on the old channel until
    terminal. Returns how many."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        rebind_machine.check("finish_on_old", rebind.state)
        count = _revert_pending(
            rebind,
            now,
            move_pks=move_pks,
            to_state=MoveState.FINISHING_ON_OLD,
            reason="let finish on old by an operator",
        )
        _record(rebind, actor, "finish_on_old", moves=len(move_pks), changed=count)
    return count


def rebind_moves_now(pk: object, *, move_pks: list[int], actor: str) -> int:
    """Move these tasks now (a draining rebind's): a move waiting for its notice is
    activated without it (the notice withdrawn if still open: the operator decided the
    receiver need not be told); a task finishing on old gets its move and notice now.
    Returns how many changed."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        rebind_machine.check("move_now", rebind.state)
        moves = _locked_moves(
            # What the console lists and the API's `onOldVersion` shows: a finished task
            # finishing on old is not on it (it settles as finished on old).
            ChannelMove.objects.filter(rebind=rebind, pk__in=move_pks)
            .on_old()
            .select_related("old_binding")
        )
        waiting = [m for m in moves if m.state == MoveState.NOTICE_PENDING]
        Delivery.objects.filter(
            pk__in=[m.notice_id for m in waiting if m.notice_id],
            state__in=OPEN_DELIVERY_STATES,
        ).update(
            state=DeliveryState.SUPERSEDED,
            last_error=f"rebind {rebind.pk}: moved by an operator without the notice",
            finished_at=now,
        )
        notices.activate([m.pk for m in waiting], now)
        finishing = [m for m in moves if m.state == MoveState.FINISHING_ON_OLD]
        ChannelMove.objects.filter(pk__in=[m.pk for m in finishing]).delete()
        try:
            channel_moves.move_configs(
                rebind_pk=rebind.pk,
                items=[(m.task, m.config) for m in finishing],
                new_fields=_new_fields(rebind),
                channels=_channels(rebind),
                now=now,
            )
        except NoticeIncomplete as exc:
            raise RebindInvalid("moves", str(exc)) from None
        _record(rebind, actor, "move_now", moves=len(move_pks), changed=len(moves))
        ring_on_commit()
    return len(moves)


def rebind_orphans(pk: object, *, actor: str) -> int:
    """Re-bind a cut-over rebind's orphaned configs of in-flight tasks to their new version
    (each opens with a snapshot of its task). A version retired meanwhile (the client
    registered the config again, or deleted it) is never activated; a finished task is not
    re-bound (its client was told to GetTask): what its version held is superseded. Returns
    how many were re-bound."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        rebind = _lock(pk)
        rebind_machine.check("rebind_orphans", rebind.state)
        # Only a version never retired is activated (a client's re-registration or a deleted
        # config retired it); a terminal task is left as it is (its client has GetTask).
        moves = _locked_moves(
            ChannelMove.objects.filter(
                rebind=rebind,
                state=MoveState.ORPHANED,
                new_binding__retired_at__isnull=True,
                config__deleted_at__isnull=True,
            )
            .exclude(task__state__in=TERMINAL_VALUES)
            .select_related("new_binding")
        )
        for move in moves:
            channel_moves.orphan_reopen(move, task=move.task, now=now)
        # What a finished orphan's version held ends visibly: never sent, not re-bound.
        Delivery.objects.filter(
            state=DeliveryState.HELD,
            binding__in=ChannelMove.objects.filter(
                rebind=rebind, state=MoveState.ORPHANED, task__state__in=TERMINAL_VALUES
            ).values("new_binding"),
        ).update(
            state=DeliveryState.SUPERSEDED,
            last_error="the task finished while orphaned: not re-bound (GetTask shows it)",
            finished_at=now,
        )
        _record(rebind, actor, "rebind_orphans", count=len(moves))
        _refresh_counts(rebind)
        ring_on_commit()
    return len(moves)


def _refresh_counts(rebind: Rebind) -> None:
    """Store the live counts on the row. Every ending transition calls it in its own
    transaction, so a rebind read as ended carries the counts it ended with."""
    Rebind.objects.filter(pk=rebind.pk).update(
        counts=rebind_counts(rebind), counts_at=timezone.now()
    )


def _retire_old_key_when_due(rebind: Rebind) -> None:
    """After a rebind ended, retire its old key once its margin passed (a cut-over's once its
    final notices are settled), unless another open rebind still drains on it."""
    if not rebind.old_key_id or rebind.state in OPEN_REBIND_STATES:
        return
    now = timezone.now()
    if rebind.state == RebindState.CUT_OVER and rebind.old_key_retire_after is None:
        open_notices = ChannelMove.objects.filter(
            rebind=rebind, notice__state__in=OPEN_DELIVERY_STATES
        ).exists()
        if open_notices:
            return
        Rebind.objects.filter(pk=rebind.pk).update(
            old_key_retire_after=now
            + timedelta(seconds=settings.A2A_WEBHOOK_SIGNATURE_TOLERANCE_SECONDS)
        )
        return
    if rebind.old_key_retire_after is None or rebind.old_key_retire_after > now:
        return
    if Rebind.objects.filter(old_key_id=rebind.old_key_id, state__in=OPEN_REBIND_STATES).exists():
        return
    with transaction.atomic(durable=True):
        retired = SigningKey.objects.filter(
            pk=rebind.old_key_id, state=SigningKeyState.RETIRING
        ).update(state=SigningKeyState.RETIRED, retired_at=now)
        if retired:
            _record(rebind, MONITOR_ACTOR, "retire_old_key", kid=rebind.old_key.kid)
            _touch_agent(rebind.agent_id)


def rebind_monitor() -> int:
    """The beat job's work: advance every open rebind, and the ended ones whose old key has
    yet to retire or whose notices are still on their way (their stored counts follow the
    notices: a cut-over's final ones go out after it ended). Returns how many it looked at."""
    ended = [RebindState.COMPLETED, RebindState.CUT_OVER, RebindState.ABORTED]
    pks = list(
        Rebind.objects.filter(
            Q(state__in=OPEN_REBIND_STATES)
            | Q(state__in=ended)
            & (
                Q(old_key__state=SigningKeyState.RETIRING)
                # Its stored counts still show notices on their way: refreshed until not.
                | Q(counts__notices__pending__gt=0)
            )
        ).values_list("pk", flat=True)
    )
    for pk in pks:
        try:
            rebind_advance(pk)
        except Exception:  # one broken rebind must not stop the others: logged, retried next run
            logger.exception("rebind.advance_failed", extra={"rebind": str(pk)})
    return len(pks)
