"""The walk through rebinds that found issue 43's bugs, as tests on the path users take: tasks
and configs through the protocol (both bindings, the default agent and one by slug), the
operator's `rebind` command, the production delivery pump over HTTP, and the strict receiver
of docs/webhooks-receiving.md §5 (tests/strict_receiver.py). Each of these failed before the
fix it names."""

from __future__ import annotations

import json

import pytest

from agents.card_render import PUSH_CHANNEL_URI
from tasks import services as task_services
from tasks.models import Task
from tasks.states import TaskState
from tests import protocol_push
from tests.factories import AgentFactory
from tests.protocol_push import card_jwks_url
from tests.strict_receiver import StrictReceiver, command
from webhooks.console.delivery_actions import delivery_replay_explained
from webhooks.delivery.pump import run_pump
from webhooks.models import (
    Alert,
    AlertKind,
    ChannelMove,
    Delivery,
    DeliveryState,
    MoveState,
    PushBinding,
    Rebind,
    RebindState,
)
from webhooks.rebinds.operations import rebind_monitor as rebinds_monitor
from webhooks.rebinds.operations import rebind_moves_finish_on_old as rebinds_finish_on_old

pytestmark = [pytest.mark.django_db(transaction=True)]

V1, V2 = "/hooks/v1/", "/hooks/v2/"


@pytest.fixture(autouse=True)
def _fast_delivery(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.A2A_WEBHOOK_RETRY_SCHEDULE = ["0"]
    settings.A2A_WEBHOOK_TIMEOUT_SECONDS = 2
    settings.A2A_WEBHOOK_PUMP_LINGER_SECONDS = 0


@pytest.fixture
def receiver():
    made = []

    def make(agent) -> StrictReceiver:
        made.append(StrictReceiver(card_jwks_url(agent)))
        return made[-1]

    yield make
    for r in made:
        r.stop()


def _agent(default: bool = False):
    # A card max-age of 0: a rotation's new key signs at once (no overlap to wait for).
    return AgentFactory(
        slug="walk",
        is_default=default,
        executor="external",
        card_max_age=0,
        push_rebind_min_overlap=0,
    )


def _open(agent, rx, binding=protocol_push.JSONRPC, n: int = 0) -> str:
    task = protocol_push.open_task(
        agent, push={"id": "cfg", "url": f"{rx.origin}{V1}task-{n}"}, binding=binding
    )
    task_services.task_transition(task_id=task, to_state=TaskState.WORKING)
    run_pump()
    return task


def _start(agent, rx, *extra: str) -> Rebind:
    pk = command("start", agent.slug, "--move-prefix", rx.origin + V1, rx.origin + V2, *extra)
    assert pk, "the rebind was refused"
    return Rebind.objects.get(pk=pk)


def _seen(rx) -> list[tuple[str | None, str]]:
    return [(a.version, a.kind) for a in rx.answers]


@pytest.mark.parametrize("default", [True, False], ids=["default-agent", "agent-by-slug"])
@pytest.mark.parametrize("binding", [protocol_push.JSONRPC, protocol_push.REST])
@pytest.mark.parametrize("rotate", [False, True], ids=["move", "move-and-rotate"])
def test_a_strict_receiver_follows_a_drain(receiver, default, binding, rotate):
    """Before: every notice had `"jwksUrl": ""` (the URL was built only from an issuer with
    /.well-known/ in it; the protocol stores the agent's base URL), so the strict receiver
    refused it and the notice dead-lettered."""
    agent = _agent(default)
    rx = receiver(agent)
    task = _open(agent, rx, binding)
    rebind = _start(agent, rx, *(["--rotate-key"] if rotate else []))
    run_pump()
    [notice] = Delivery.objects.filter(kind="notice")
    entry = json.loads(notice.body)["statusUpdate"]["metadata"][PUSH_CHANNEL_URI]
    assert entry["jwksUrl"] == rx.jwks_url
    task_services.task_transition(task_id=task, to_state=TaskState.INPUT_REQUIRED)
    run_pump()
    command("advance", str(rebind.pk))
    assert _seen(rx) == [
        ("cfg.v1", "accepted"),  # the registration's snapshot
        ("cfg.v1", "accepted"),  # WORKING
        ("cfg.v1", "accepted"),  # the channel-changed notice
        ("cfg.v2", "accepted"),  # INPUT_REQUIRED on the new channel
    ]
    assert Rebind.objects.get(pk=rebind.pk).state == RebindState.COMPLETED


def test_a_strict_receiver_follows_a_cutover_and_the_orphans_rebind(receiver):
    agent = _agent()
    rx = receiver(agent)
    task = _open(agent, rx)
    rebind = _start(agent, rx, "--policy", "cutover")
    run_pump()
    task_services.task_transition(task_id=task, to_state=TaskState.INPUT_REQUIRED)
    run_pump()  # held for the orphan's new version
    assert rx.trust.is_orphaned(task)
    assert command("rebind-orphans", str(rebind.pk)) is not None
    run_pump()
    assert _seen(rx) == [
        ("cfg.v1", "accepted"),
        ("cfg.v1", "accepted"),
        ("cfg.v1", "accepted"),  # the channel-orphaned notice
        ("cfg.v2", "accepted"),  # the re-bind's snapshot, trusted on first use
    ]
    assert not rx.trust.is_orphaned(task)


def test_a_key_rotation_after_a_cutover_leaves_the_orphan_where_the_cutover_put_it(receiver):
    """Before: the rotation moved the orphaned config from its retired old version (a notice
    on the retired channel), retired the version the cutover had prepared unused, and
    activated a new one on the URL the operator had moved away from."""
    agent = _agent()
    rx = receiver(agent)
    task = _open(agent, rx)
    cutover = _start(agent, rx, "--policy", "cutover")
    run_pump()
    orphan_version = ChannelMove.objects.get(rebind=cutover).new_binding
    sent_before = len(rx.answers)
    rotation = command("start", agent.slug, "--rotate-key")
    assert rotation
    run_pump()
    assert not ChannelMove.objects.filter(rebind_id=rotation).exists()
    assert len(rx.answers) == sent_before  # no notice on the retired channel
    orphan_version.refresh_from_db()
    assert (orphan_version.activated_at, orphan_version.retired_at) == (None, None)
    assert PushBinding.objects.filter(config__task_id=task).count() == 2
    task_services.task_transition(task_id=task, to_state=TaskState.INPUT_REQUIRED)
    command("rebind-orphans", str(cutover.pk))
    run_pump()
    assert _seen(rx)[-1] == ("cfg.v2", "accepted")
    assert all(a.kind == "accepted" for a in rx.answers)
    assert rx.answers[-1].task_id == task


def test_rebind_orphans_activates_no_retired_version_and_skips_finished_tasks(receiver):
    """Before: `rebind-orphans` activated the cutover's version of a config its client had
    registered again meanwhile (activatedAt after retiredAt), and posted a snapshot of a task
    that had already completed."""
    agent = _agent()
    rx = receiver(agent)
    again, done = _open(agent, rx, n=0), _open(agent, rx, n=1)
    cutover = _start(agent, rx, "--policy", "cutover")
    run_pump()
    protocol_push.register(agent, again, {"id": "cfg", "url": f"{rx.origin}{V2}again"})
    task_services.task_transition(task_id=done, to_state=TaskState.COMPLETED)
    run_pump()
    sent_before = len(rx.answers)
    command("rebind-orphans", str(cutover.pk))
    run_pump()
    assert len(rx.answers) == sent_before
    for binding in PushBinding.objects.filter(retired_at__isnull=False):
        assert binding.activated_at is None or binding.activated_at <= binding.retired_at
    # The client's registration was its re-bind: the move says so, the mark is gone.
    move = ChannelMove.objects.get(task_id=again)
    assert move.state == MoveState.REBOUND
    assert PUSH_CHANNEL_URI not in (Task.objects.get(pk=again).metadata or {})
    assert all(a.kind == "accepted" for a in rx.answers)


def test_a_dead_notice_raises_one_alert_naming_the_task_and_a_replay_finishes_the_drain(
    receiver,
):
    """Before: the alert kind existed and was raised nowhere."""
    agent = _agent()
    rx = receiver(agent)
    task = _open(agent, rx)
    rx.mode = "refuse"
    rebind = _start(agent, rx)
    run_pump()
    [notice] = Delivery.objects.filter(kind="notice")
    notice.refresh_from_db()
    assert notice.state == DeliveryState.DEAD
    for _ in range(3):  # the monitor runs every few seconds: still one alert
        command("advance", str(rebind.pk))
    [alert] = Alert.objects.filter(kind=AlertKind.REBIND_NOTICE_DEAD, rebind=rebind)
    assert (alert.count, alert.resolved_at) == (1, None)
    assert task in alert.message
    rx.mode = "accept"
    delivery_replay_explained(event_ids=[notice.event_id], actor="operator")
    run_pump()
    command("advance", str(rebind.pk))
    alert.refresh_from_db()
    assert alert.resolved_at is not None
    assert Rebind.objects.get(pk=rebind.pk).state == RebindState.COMPLETED


def test_a_notice_whose_move_no_longer_waits_is_not_replayed(receiver):
    """A dead notice of a rebind aborted since would announce a channel that is not coming:
    the deliveries' replay (API, admin, the rebind page) leaves it alone and says why."""
    agent = _agent()
    rx = receiver(agent)
    _open(agent, rx)
    rx.mode = "refuse"
    rebind = _start(agent, rx)
    run_pump()
    [notice] = Delivery.objects.filter(kind="notice", state=DeliveryState.DEAD)
    command("abort", str(rebind.pk), "--reason", "wrong prefix")
    rx.mode = "accept"
    outcome = delivery_replay_explained(event_ids=[notice.event_id], actor="operator")
    assert outcome.replayed == 0
    assert [s.reason for s in outcome.skipped] == ["notice_not_awaited"]
    notice.refresh_from_db()
    assert notice.state == DeliveryState.DEAD
    assert Rebind.objects.get(pk=rebind.pk).reason == "aborted: wrong prefix"


def test_a_config_deleted_mid_drain_ends_its_move_and_nothing_revives_it(receiver):
    """Found by the model (docs/decisions.md): a config deleted while its move waited for the
    notice kept the move open; "let finish on old" then un-retired the deleted config's old
    version, the drain completed, and registering the config again left a task counted on
    the old version of a completed rebind (a cutover of it made two current versions)."""
    agent = _agent()
    rx = receiver(agent)
    task = _open(agent, rx)
    rx.mode = "down"
    rebind = _start(agent, rx)
    [move] = ChannelMove.objects.filter(rebind=rebind)
    protocol_push.delete(agent, task, "cfg")
    move.refresh_from_db()
    assert move.state == MoveState.CONFIG_DELETED
    assert (
        rebinds_finish_on_old(rebind.pk, move_pks=[move.pk], actor="ops"),
        PushBinding.objects.filter(config__task_id=task, retired_at__isnull=True).count(),
    ) == (0, 0)
    command("advance", str(rebind.pk))
    assert Rebind.objects.get(pk=rebind.pk).state == RebindState.COMPLETED
    rx.mode = "accept"
    rx.trust.forget_task(task)  # the client registers again what it deleted (docs §5)
    protocol_push.register(agent, task, {"id": "cfg", "url": f"{rx.origin}{V2}again"})
    run_pump()
    assert [
        b.version for b in PushBinding.objects.filter(config__task_id=task, retired_at__isnull=True)
    ] == [3]
    assert Rebind.objects.get(pk=rebind.pk).counts["onOldVersionTotal"] == 0
    assert _seen(rx)[-1] == ("cfg.v3", "accepted")


@pytest.mark.parametrize("finished", [True, False], ids=["finished-task", "cutover-policy"])
def test_a_client_re_registering_at_once_is_announced_to_its_receiver(receiver, finished):
    """Found by the model: a client registering a live config again for a finished task (or
    under the cutover policy) got its new version at once with no notice, so its strict
    receiver, which trusts the task's old channel, refused the new version's snapshot."""
    agent = _agent()
    if not finished:
        agent.push_rebind_policy = "cutover"
        agent.save(update_fields=["push_rebind_policy"])
    rx = receiver(agent)
    task = _open(agent, rx)
    if finished:
        task_services.task_transition(task_id=task, to_state=TaskState.COMPLETED)
    protocol_push.register(agent, task, {"id": "cfg", "url": f"{rx.origin}{V2}again"})
    run_pump()
    assert _seen(rx)[-2:] == [("cfg.v1", "accepted"), ("cfg.v2", "accepted")]
    assert all(a.kind == "accepted" for a in rx.answers)
    [rebind] = Rebind.objects.filter(agent=agent)
    assert (rebind.state, rebind.policy) == (RebindState.COMPLETED, "cutover")


def test_an_ended_rebinds_counts_follow_its_last_notices(receiver):
    """Found on `make run`: after a cutover, `rebind show` and the API kept "notices pending"
    and "0 re-bound" (the counts stored at the cutover) once the notices were delivered and
    the orphans re-bound; the console alone was right."""
    agent = _agent()
    rx = receiver(agent)
    _open(agent, rx)
    cutover = _start(agent, rx, "--policy", "cutover")
    assert cutover.counts["notices"]["pending"] == 1
    run_pump()
    rebinds_monitor()  # the beat job
    assert Rebind.objects.get(pk=cutover.pk).counts["notices"] == {
        "delivered": 1,
        "pending": 0,
        "dead": 0,
        "superseded": 0,
    }
    command("rebind-orphans", str(cutover.pk))
    assert Rebind.objects.get(pk=cutover.pk).counts["rebound"] == 1
