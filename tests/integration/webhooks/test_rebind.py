"""Rebinds through their services (webhooks/rebinds/operations.py), in process: the rows they
write, the notices, the moves, deadlines, cutover, abort, scheduling and every refused request.

Deliveries are claimed and recorded with the real claim/record services; the transport is the
one edge replaced (an answer per attempt), since no receiver runs here. The process tests in
tests/integration/webhooks/test_rebind_processes.py drive the same flows through worker, beat
and receiver processes.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from a2a.types import a2a_pb2
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management import CommandError, call_command
from django.db.models import Count
from django_celery_beat.models import ClockedSchedule, PeriodicTask
from google.protobuf import json_format

from a2a_platform.lib.crypto import decrypt
from a2a_platform.protocol import context
from agents.models import OperatorAction, SigningKey, SigningKeyState
from agents.signing import jwks, live_private_keys
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory, task_create, user_message
from tests.protocol_push import card_jwks_url, delete, register, task_with_push, verified_notice
from tests.readiness_helpers import mark_workers_live
from webhooks.alerts import card_age_check
from webhooks.console.operator_groups import sync_groups
from webhooks.delivery.transport import TransportResult
from webhooks.errors import RebindConflict, RebindInvalid, RebindNotFound
from webhooks.management.commands.rebind import Command as RebindCommand
from webhooks.models import (
    Alert,
    AlertKind,
    ChannelMove,
    Delivery,
    DeliveryState,
    PushBinding,
    PushConfig,
    Rebind,
    RebindState,
)
from webhooks.rebinds import machine as rebind_machine
from webhooks.rebinds.operations import (
    RebindRequest,
    rebind_abort,
    rebind_advance,
    rebind_cutover,
    rebind_extend,
    rebind_moves_finish_on_old,
    rebind_orphans,
    rebind_start,
    retire_margin,
)
from webhooks.selectors import rebind_stragglers
from webhooks.services import delivery_sweep

pytestmark = pytest.mark.usefixtures("public_dns")

ROOT = Path(__file__).resolve().parents[3]
URI = "urn:a2a-platform:ext:push-channel:v1"
V1 = "https://client.example.org/hooks/v1/"
V2 = "https://client.example.org/hooks/v2/"
T0 = datetime(2030, 1, 15, 12, 0, tzinfo=UTC)
OK = TransportResult(200, {}, "", 1.0, None, None)
DOWN = TransportResult(503, {}, "", 1.0, "http_5xx", None)


@pytest.fixture
def agent(transactional_db):
    """The default agent (the in-process `wire` reaches it at the root), with its key."""
    return AgentFactory(
        slug="hooks", is_default=True, executor="external", signing_key=True, card_max_age=30
    )


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(T0, tick=False)
    return time_machine


def in_flight(agent, n: int = 3, state=TaskState.WORKING, prefix: str = V1) -> list[Task]:
    """`n` tasks opened through the protocol (SendMessage with an inline push config
    `cfg-<i>` at `<prefix>task-<i>`: the binding's issuer is the agent's URL, as for a
    client), then moved to `state`."""
    tasks = []
    for i in range(n):
        task = task_with_push(agent, f"{prefix}task-{i}", config_id=f"cfg-{i}")
        services.task_transition(task_id=task.pk, to_state=state)
        tasks.append(task)
    return tasks


def deliver_all(
    answer: TransportResult = OK, notices: list | None = None
) -> list[tuple[str, str, int]]:
    """Deliver every due head, config by config, in order: (binding url, kind, seq) sent.
    The claims of the notices sent are appended to `notices`, when given."""
    sent = []
    progress = True
    while progress:
        progress = False
        for push in PushConfig.objects.order_by("pk"):
            while (claim := delivery_claim_head(config_pk=push.pk)) is not None:
                row = Delivery.objects.select_related("binding").get(pk=claim.delivery_pk)
                sent.append((row.binding.url, row.kind, row.seq))
                if notices is not None and row.kind == "notice":
                    notices.append(claim)
                delivery_record(claim=claim, result=answer)
                progress = True
                if answer is not OK:
                    break
    return sent


def counts() -> dict:
    return dict(Delivery.objects.values_list("state").annotate(n=Count("id")))


def rows() -> tuple[int, ...]:
    return (
        Rebind.objects.count(),
        ChannelMove.objects.count(),
        PushBinding.objects.count(),
        Delivery.objects.count(),
        SigningKey.objects.count(),
        OperatorAction.objects.count(),
    )


# --- drain ----------------------------------------------------------------------------------


def test_drain_moves_each_task_after_its_notice_is_delivered_on_the_old_path(agent):
    tasks = in_flight(agent)
    deliver_all()  # what was owed before the rebind
    rebind = rebind_start(
        RebindRequest(agent=agent, move_from=V1, move_to=V2, reason="hooks v2"), actor="ops"
    )
    assert rebind.state == RebindState.DRAINING
    assert rebind.counts["noticePending"] == 3
    for task in tasks:  # the incident: the tasks now wait for input
        services.task_transition(task_id=task.pk, to_state=TaskState.INPUT_REQUIRED)

    claims: list = []
    sent = deliver_all(notices=claims)
    # Per config: the notice on v1 first, then the held INPUT_REQUIRED status on v2.
    for i in range(3):
        mine = [s for s in sent if s[0].endswith(f"task-{i}")]
        assert mine == [(f"{V1}task-{i}", "notice", 2), (f"{V2}task-{i}", "status", 3)]
    body = Delivery.objects.filter(kind="notice").first().body
    notice = json.loads(body)["statusUpdate"]
    payload = notice["metadata"][URI]
    assert notice["status"]["state"] == "TASK_STATE_WORKING"
    # The official SDK's types read it as a plain status update (the extension is metadata).
    parsed = json_format.ParseDict(json.loads(body), a2a_pb2.StreamResponse())
    assert parsed.WhichOneof("payload") == "status_update"
    assert parsed.status_update.status.state == a2a_pb2.TASK_STATE_WORKING
    assert parsed.status_update.metadata[URI]["notice"] == "channel-changed"
    assert payload["notice"] == "channel-changed"
    assert payload["newChannel"]["pathPrefix"] == "/hooks/v2/"
    assert payload["newChannel"]["origin"] == "https://client.example.org:443"
    assert payload["fromSeq"] == 3
    # The JWKS the card advertises (beside the agent's URL the configs were registered at),
    # and each notice as a strict receiver reads it (verified, then parse_channel_notice).
    advertised = card_jwks_url(agent)
    assert advertised == "http://testserver/.well-known/jwks.json"
    assert payload["jwksUrl"] == advertised
    assert len(claims) == 3
    for claim in claims:
        read = verified_notice(claim, agent)
        assert (read.kind, read.jwks_url, read.from_seq) == ("channel-changed", advertised, 3)
        assert read.new_channel.path_prefix == "/hooks/v2/"

    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.COMPLETED
    assert rebind.counts["moved"] == 3
    assert rebind.counts["onOldVersionTotal"] == 0
    assert rebind.counts["notices"]["delivered"] == 3
    actions = list(OperatorAction.objects.order_by("id").values_list("action", flat=True))
    assert actions[-3:] == ["rebind_start", "rebind_drain", "rebind_complete"]
    assert not Delivery.objects.exclude(state=DeliveryState.DELIVERED).exists()


def test_new_registrations_during_a_drain_bind_to_the_new_version_at_once(agent):
    in_flight(agent, 1)
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    late = in_flight(agent, 1, prefix=V2)[0]
    push = PushConfig.objects.get(task=late)
    assert push.bindings.get().activated_at is not None  # not held, not moved
    rebind = rebind_advance(rebind.pk)
    assert ChannelMove.objects.filter(config=push).count() == 0


def test_a_dead_notice_keeps_the_task_on_the_old_version_visibly(agent, settings):
    settings.A2A_WEBHOOK_RETRY_SCHEDULE = []
    settings.A2A_WEBHOOK_AUTH_RETRY_SCHEDULE = []
    task = in_flight(agent, 1)[0]
    deliver_all()
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    services.task_transition(task_id=task.pk, to_state=TaskState.INPUT_REQUIRED)
    deliver_all(DOWN)
    notice = Delivery.objects.get(kind="notice")
    assert notice.state == DeliveryState.DEAD
    # Not moved: the status is still held for v2, nothing went to v2.
    assert Delivery.objects.get(seq=3).state == DeliveryState.HELD
    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.DRAINING
    assert rebind.counts["notices"]["dead"] == 1
    assert rebind.counts["onOldVersion"] == {"input-required": 1}
    [straggler] = rebind_stragglers(rebind)
    assert (straggler["task"], straggler["notice"]) == (str(task.pk), "dead")


def test_key_rotation_publishes_first_then_signs_and_retires_after_the_margin(agent, clock):
    old = SigningKey.objects.get(agent=agent)
    in_flight(agent, 2)
    deliver_all()
    rebind = rebind_start(RebindRequest(agent=agent, rotate_key=True), actor="ops")
    assert rebind.state == RebindState.PREPARING
    new = SigningKey.objects.get(pk=rebind.new_key_id)
    assert new.state == SigningKeyState.PUBLISHED  # in the JWKS, not signing
    assert [k["kid"] for k in jwks(agent)["keys"]] == [new.kid, old.kid]
    assert [kid for kid, _ in live_private_keys(agent)] == [old.kid]
    assert rebind.activate_key_at == T0 + timedelta(seconds=30)  # the card's max-age
    clock.shift(29)
    assert rebind_advance(rebind.pk).state == RebindState.PREPARING
    clock.shift(1)
    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.DRAINING
    old.refresh_from_db()
    new.refresh_from_db()
    assert (old.state, new.state) == (SigningKeyState.RETIRING, SigningKeyState.ACTIVE)
    notice = json.loads(Delivery.objects.filter(kind="notice").first().body)
    payload = notice["statusUpdate"]["metadata"][URI]
    assert payload["oldChannel"]["keyIds"] == [old.kid]
    assert payload["newChannel"]["keyIds"] == [new.kid]
    assert payload["newChannel"]["version"].endswith(".v2")  # same URL, next version
    advertised = card_jwks_url(agent)
    assert payload["jwksUrl"] == advertised
    claims: list = []
    deliver_all(notices=claims)
    assert len(claims) == 2
    for claim in claims:  # signed by both keys; a receiver holding either verifies it
        read = verified_notice(claim, agent)
        assert (read.kind, read.jwks_url) == ("channel-changed", advertised)
        assert read.new_channel.key_ids == (new.kid,)
    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.COMPLETED
    assert rebind.old_key_retire_after == T0 + timedelta(seconds=30 + retire_margin())
    clock.shift(retire_margin() - 1)
    rebind_advance(rebind.pk)
    old.refresh_from_db()
    assert old.state == SigningKeyState.RETIRING  # still signing, still published
    clock.shift(2)
    rebind_advance(rebind.pk)
    old.refresh_from_db()
    assert old.state == SigningKeyState.RETIRED
    assert [k["kid"] for k in jwks(agent)["keys"]] == [new.kid]


def test_client_reregistration_is_a_one_task_rebind_that_completes(agent):
    task = in_flight(agent, 1)[0]
    register(agent, task.pk, {"id": "cfg-0", "url": f"{V2}moved"})
    rebind = Rebind.objects.get()
    assert (rebind.config_id, rebind.actor) == (PushConfig.objects.get().pk, "client anonymous")
    deliver_all()
    assert rebind_advance(rebind.pk).state == RebindState.COMPLETED


def test_reregistering_again_before_the_notice_replaces_the_waiting_version(agent):
    task = in_flight(agent, 1)[0]
    register(agent, task.pk, {"id": "cfg-0", "url": f"{V2}a"})
    register(agent, task.pk, {"id": "cfg-0", "url": f"{V2}b"})
    push = PushConfig.objects.get()
    v2, v3 = push.bindings.get(version=2), push.bindings.get(version=3)
    assert v2.retired_at is not None
    assert v2.activated_at is None
    assert not Delivery.objects.filter(binding=v2).exclude(state="superseded").exists()
    sent = deliver_all()
    assert [s[1] for s in sent if s[0] == f"{V1}task-0"] == ["snapshot", "status", "notice"]
    assert [s[1] for s in sent if s[0].startswith(V2)] == ["snapshot", "snapshot"]
    v3.refresh_from_db()
    assert v3.activated_at is not None


# --- finish on old, deadlines ---------------------------------------------------------------


def test_finish_on_old_keeps_tasks_until_terminal_then_completes(agent):
    a, b = in_flight(agent, 2)
    rebind = rebind_start(
        RebindRequest(agent=agent, move_from=V1, move_to=V2, finish_on_old=True), actor="ops"
    )
    assert not Delivery.objects.filter(kind="notice").exists()
    services.task_transition(task_id=a.pk, to_state=TaskState.COMPLETED)
    deliver_all()
    assert rebind_advance(rebind.pk).counts["onOldVersionTotal"] == 1
    services.task_transition(task_id=b.pk, to_state=TaskState.COMPLETED)
    deliver_all()
    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.COMPLETED
    assert rebind.counts["finishedOnOld"] == 2
    assert set(Delivery.objects.values_list("binding__url", flat=True)) <= {
        f"{V1}task-0",
        f"{V1}task-1",
    }


def test_deadline_alerts_then_cuts_over_a_task_left_in_input_required(agent, clock):
    [task] = in_flight(agent, 1, state=TaskState.INPUT_REQUIRED)
    rebind = rebind_start(
        RebindRequest(
            agent=agent, move_from=V1, move_to=V2, finish_on_old=True, deadline_seconds=100
        ),
        actor="ops",
    )
    seen = []
    for seconds in (49, 1, 40, 9, 1):
        clock.shift(seconds)
        rebind = rebind_advance(rebind.pk)
        seen.append((rebind.alerted_percent, rebind.state))
    assert seen == [
        (0, "draining"),
        (50, "draining"),
        (90, "draining"),
        (90, "draining"),
        (100, "cut_over"),
    ]
    alert = Alert.objects.get(kind=AlertKind.REBIND_DEADLINE, rebind=rebind)
    assert "100% of its deadline" in alert.message
    assert alert.count == 3
    task.refresh_from_db()
    mark = task.metadata[URI]
    assert mark["orphaned"] is True
    assert mark["orphanedChannels"][0]["version"] == "cfg-0.v1"
    final = Delivery.objects.get(kind="notice")
    payload = json.loads(final.body)["statusUpdate"]["metadata"][URI]
    assert payload["notice"] == "channel-orphaned"
    assert "newChannel" not in payload
    advertised = card_jwks_url(agent)
    assert payload["jwksUrl"] == advertised
    claims: list = []
    deliver_all(notices=claims)
    [read] = [verified_notice(claim, agent) for claim in claims]
    assert (read.kind, read.jwks_url, read.new_channel) == ("channel-orphaned", advertised, None)


def test_extend_once_on_timeout_then_cut_over(agent, clock):
    in_flight(agent, 1, state=TaskState.INPUT_REQUIRED)
    rebind = rebind_start(
        RebindRequest(
            agent=agent,
            move_from=V1,
            move_to=V2,
            finish_on_old=True,
            deadline_seconds=60,
            on_timeout="extend",
        ),
        actor="ops",
    )
    clock.shift(60)
    rebind = rebind_advance(rebind.pk)
    assert (rebind.state, rebind.deadline) == ("draining", T0 + timedelta(seconds=120))
    assert rebind.extended_at == T0 + timedelta(seconds=60)
    clock.shift(60)
    assert rebind_advance(rebind.pk).state == RebindState.CUT_OVER


# --- cutover ----------------------------------------------------------------------------------


def test_cutover_orphans_in_flight_tasks_with_a_final_notice_and_visible_reasons(
    agent, wire, settings
):
    tasks = in_flight(agent, 2)  # their snapshot and WORKING status are still owed
    rebind = rebind_start(
        RebindRequest(agent=agent, move_from=V1, move_to=V2, policy="cutover"), actor="ops"
    )
    assert rebind.state == RebindState.CUT_OVER
    superseded = Delivery.objects.filter(state=DeliveryState.SUPERSEDED)
    assert superseded.count() == 4
    assert {d.last_error for d in superseded} == {f"rebind {rebind.pk} cut over"}
    claims: list = []
    sent = deliver_all(notices=claims)
    assert sorted(s[1] for s in sent) == ["notice", "notice"]
    advertised = card_jwks_url(agent)
    for claim in claims:
        read = verified_notice(claim, agent)
        assert (read.kind, read.jwks_url) == ("channel-orphaned", advertised)
    for task in tasks:
        got = wire.rpc("GetTask", {"id": str(task.pk)})["result"]
        assert got["metadata"][URI]["orphaned"] is True
    # Later events wait on the new version until an operator re-binds the orphans.
    services.task_transition(task_id=tasks[0].pk, to_state=TaskState.COMPLETED)
    assert Delivery.objects.filter(state=DeliveryState.HELD).count() == 1
    # Only the task still in flight is re-bound: the finished one's client was told to
    # GetTask, and a channel for a task that can emit nothing more is not opened; what its
    # version held ends superseded, with the reason (docs/rebinds.md).
    assert rebind_orphans(rebind.pk, actor="ops") == 1
    [held] = Delivery.objects.filter(task=tasks[0], binding__version=2)
    assert (held.state, held.last_error) == (
        DeliveryState.SUPERSEDED,
        "the task finished while orphaned: not re-bound (GetTask shows it)",
    )
    sent = deliver_all()
    assert sorted((s[0], s[1]) for s in sent) == [(f"{V2}task-1", "snapshot")]
    got = wire.rpc("GetTask", {"id": str(tasks[1].pk)})["result"]
    assert URI not in got.get("metadata", {})


def test_operator_cutover_of_a_drain_replaces_an_undelivered_notice(agent):
    task = in_flight(agent, 1)[0]
    deliver_all()
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    rebind = rebind_cutover(rebind.pk, actor="ops")
    assert rebind.state == RebindState.CUT_OVER
    kinds = dict(Delivery.objects.filter(kind="notice").values_list("state", "body"))
    assert set(kinds) == {DeliveryState.SUPERSEDED, DeliveryState.PENDING}
    assert "channel-orphaned" in kinds[DeliveryState.PENDING]
    final = json.loads(kinds[DeliveryState.PENDING])["statusUpdate"]["metadata"][URI]
    assert final["jwksUrl"] == card_jwks_url(agent)
    claims: list = []
    deliver_all(notices=claims)
    [read] = [verified_notice(claim, agent) for claim in claims]
    assert (read.kind, read.jwks_url) == ("channel-orphaned", final["jwksUrl"])
    task.refresh_from_db()
    assert task.metadata[URI]["orphaned"] is True


# --- abort, schedule --------------------------------------------------------------------------


def test_abort_during_drain_keeps_moved_tasks_and_returns_the_others(agent):
    a, b = in_flight(agent, 2)
    deliver_all()
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    first = PushConfig.objects.get(task=a)
    while (claim := delivery_claim_head(config_pk=first.pk)) is not None:
        delivery_record(claim=claim, result=OK)  # a's notice: a moved
    rebind = rebind_abort(rebind.pk, actor="ops", reason="wrong prefix")
    assert rebind.state == RebindState.ABORTED
    assert rebind.counts["moved"] == 1
    assert rebind.counts["reverted"] == 1
    services.task_transition(task_id=a.pk, to_state=TaskState.COMPLETED)
    services.task_transition(task_id=b.pk, to_state=TaskState.COMPLETED)
    sent = deliver_all()
    assert ("https://client.example.org/hooks/v2/task-0", "status", 3) in sent
    assert ("https://client.example.org/hooks/v1/task-1", "status", 3) in sent
    assert all(kind != "notice" for _, kind, _ in sent)  # b's notice was withdrawn


def test_a_scheduled_rebind_has_one_clocked_job_and_can_be_cancelled(agent, clock):
    in_flight(agent, 1)
    at = T0 + timedelta(hours=1)
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2, at=at), actor="ops")
    assert rebind.state == RebindState.SCHEDULED
    job = PeriodicTask.objects.get(name=f"rebind {rebind.pk}")
    assert (job.one_off, job.expires, job.clocked.clocked_time) == (True, None, at)
    assert rebind_advance(rebind.pk).state == RebindState.SCHEDULED  # not yet
    rebind_abort(rebind.pk, actor="ops", reason="not needed")
    assert not PeriodicTask.objects.filter(name=f"rebind {rebind.pk}").exists()
    assert not ClockedSchedule.objects.exists()


def test_a_scheduled_rebind_starts_when_its_time_comes(agent, clock):
    in_flight(agent, 1)
    at = T0 + timedelta(minutes=5)
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2, at=at), actor="ops")
    clock.shift(300)
    assert rebind_advance(rebind.pk).state == RebindState.DRAINING


# --- refused requests change nothing -----------------------------------------------------------


@pytest.mark.parametrize(
    ("request_kw", "field"),
    [
        ({"move_from": "https://client.example.org/hooks/v9/", "move_to": V2}, "move_from"),
        ({"move_from": V1, "move_to": "https://10.0.0.1/hooks/"}, "move_to"),
        ({"move_from": V1, "move_to": "ftp://client.example.org/x/"}, "move_to"),
        ({"move_from": V1}, "move_prefix"),
        ({"move_from": V1, "move_to": V1}, "move_to"),
        ({}, "scope"),
        ({"rotate_key": True, "deadline_seconds": 0}, "deadline"),
        ({"rotate_key": True, "deadline_seconds": -5}, "deadline"),
        ({"rotate_key": True, "at": datetime(2020, 1, 1, tzinfo=UTC)}, "at"),
        ({"rotate_key": True, "policy": "sometimes"}, "policy"),
        ({"rotate_key": True, "on_timeout": "panic"}, "on_timeout"),
        ({"rotate_key": True, "policy": "cutover", "finish_on_old": True}, "finish_on_old"),
        ({"rotate_key": True, "new_url": V2}, "new_url"),
    ],
)
def test_bad_requests_are_refused_with_the_field_and_change_nothing(agent, request_kw, field):
    in_flight(agent, 1)
    before = rows()
    with pytest.raises(RebindInvalid) as refused:
        rebind_start(RebindRequest(agent=agent, **request_kw), actor="ops")
    assert refused.value.field == field
    assert rows() == before


def test_a_second_open_rebind_over_the_same_scope_is_refused_unless_forced(agent):
    in_flight(agent, 1)
    first = rebind_start(
        RebindRequest(agent=agent, move_from=V1, move_to=V2, finish_on_old=True), actor="ops"
    )
    before = rows()
    with pytest.raises(RebindConflict) as refused:
        rebind_start(RebindRequest(agent=agent, move_from=V1 + "task", move_to=V2), actor="ops")
    assert refused.value.other_pk == first.pk
    assert rows() == before
    forced = rebind_start(
        RebindRequest(agent=agent, move_from=V1 + "task", move_to=V2, force=True), actor="ops"
    )
    assert forced.forced
    assert forced.state == RebindState.DRAINING


def test_illegal_transitions_are_refused_and_change_nothing(agent):
    in_flight(agent, 1)
    deliver_all()
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    deliver_all()
    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.COMPLETED
    before = rows()
    for call in (
        lambda: rebind_abort(rebind.pk, actor="ops", reason="too late"),
        lambda: rebind_cutover(rebind.pk, actor="ops"),
        lambda: rebind_extend(rebind.pk, seconds=60, actor="ops"),
        lambda: rebind_orphans(rebind.pk, actor="ops"),
    ):
        with pytest.raises(rebind_machine.IllegalRebindTransition):
            call()
    assert rows() == before
    with pytest.raises(RebindNotFound):
        rebind_advance("not-a-uuid")


# --- declared in the card ---------------------------------------------------------------------


def _card_and_jwks(wire) -> tuple[dict, str, str]:
    mark_workers_live()
    card = wire.request("GET", "/.well-known/agent-card.json")
    keys = wire.request("GET", "/.well-known/jwks.json")
    assert card.status_code == 200, card.text
    assert keys.headers["Cache-Control"] == "public, max-age=30"  # the card's max-age
    [ext] = [e for e in card.json()["capabilities"]["extensions"] if e["uri"] == URI]
    return ext, card.headers["ETag"], keys.headers["ETag"]


def test_the_card_declares_the_policy_and_changes_with_every_rebind_step(agent, wire, clock):
    in_flight(agent, 1)
    ext, card_etag, jwks_etag = _card_and_jwks(wire)
    assert ext["required"] is False
    params = ext["params"]
    assert params["policy"] == "drain"
    assert params["minOverlapSeconds"] == 30
    assert params["currentKeyIds"] == [SigningKey.objects.get(agent=agent).kid]
    assert "draining" not in params  # nothing drains; signed cards carry no empty value
    assert params["jwksUrl"].endswith("/.well-known/jwks.json")

    rebind = rebind_start(RebindRequest(agent=agent, rotate_key=True), actor="ops")
    context._agents.clear()  # this process's agent cache (A2A_AGENT_CACHE_SECONDS)
    ext, card_etag2, jwks_etag2 = _card_and_jwks(wire)
    assert (card_etag2 != card_etag, jwks_etag2 != jwks_etag) == (True, True)
    assert ext["params"]["nextKeyIds"] == [rebind.new_key.kid]
    assert ext["params"]["draining"][0]["rebindId"] == str(rebind.pk)
    stale = wire.request("GET", "/.well-known/jwks.json", headers={"If-None-Match": jwks_etag2})
    assert stale.status_code == 304


def test_orphaned_tasks_are_filterable_in_the_admin(agent, admin_client):
    orphaned, kept = in_flight(agent, 2)
    rebind_start(
        RebindRequest(
            agent=agent,
            config=PushConfig.objects.get(task=orphaned),
            new_url=f"{V2}x",
            policy="cutover",
        ),
        actor="ops",
    )
    page = admin_client.get("/admin/tasks/task/", {"push_channel": "orphaned"})
    assert page.status_code == 200
    assert str(orphaned.pk) in page.content.decode()
    assert str(kept.pk) not in page.content.decode()


def test_tasks_outliving_the_card_raise_one_alert_per_agent(agent, clock):
    for i in range(25):
        task = task_create(agent=agent, owner="anonymous", message=user_message(f"{i}"))
        clock.shift(40 if i == 24 else 5)  # the slowest 1 %: 40 s against a 30 s max-age
        services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    assert card_age_check() == 1
    assert card_age_check() == 1
    alert = Alert.objects.get(kind=AlertKind.TASKS_OUTLIVE_CARD)
    assert "p99 task duration 40s" in alert.message
    assert alert.count == 2
    agent.card_max_age = 60
    agent.save()
    assert card_age_check() == 0


def test_the_sweeper_releases_a_delivery_held_for_a_binding_activated_meanwhile(agent):
    """On PostgreSQL a transition's outbox write waits for the config row the notice's record
    holds, then reads the binding as its statement began (not active): its delivery is held
    for a binding that is active by then. The process test saw it; the sweeper releases it."""
    task = in_flight(agent, 1)[0]
    deliver_all()
    rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    deliver_all()  # the notice: v2 is active
    push = PushConfig.objects.get()
    v2 = push.bindings.get(version=2)
    late = Delivery.objects.create(
        config=push,
        binding=v2,
        task=task,
        seq=3,
        kind="status",
        body="{}",
        state=DeliveryState.HELD,
        next_attempt_at=T0,
    )
    delivery_sweep()
    late.refresh_from_db()
    push.refresh_from_db()
    assert late.state == DeliveryState.PENDING
    assert push.head_due_at is not None
    assert deliver_all() == [(f"{V2}task-0", "status", 3)]


def test_the_admin_lists_rebinds_shows_their_moves_and_aborts_one(agent, admin_client):
    in_flight(agent, 2)
    rebind = rebind_start(
        RebindRequest(agent=agent, move_from=V1, move_to=V2, reason="hooks v2"), actor="ops"
    )
    listing = admin_client.get("/admin/webhooks/rebind/")
    assert listing.status_code == 200
    assert str(rebind.pk) in listing.content.decode()
    page = admin_client.get(f"/admin/webhooks/rebind/{rebind.pk}/change/")
    assert page.status_code == 200
    assert "notice_pending" in page.content.decode() or "notice pending" in page.content.decode()
    answer = admin_client.post(
        "/admin/webhooks/rebind/",
        {"action": "abort", "_selected_action": [str(rebind.pk)], "reason": "wrong prefix"},
        follow=True,
    )
    assert answer.status_code == 200
    rebind.refresh_from_db()
    assert rebind.state == RebindState.ABORTED
    assert OperatorAction.objects.filter(action="rebind_abort", actor="admin").exists()
    again = admin_client.post(
        "/admin/webhooks/rebind/",
        {"action": "abort", "_selected_action": [str(rebind.pk)], "reason": "wrong prefix"},
        follow=True,
    )
    assert "cannot abort a rebind that is aborted" in again.content.decode()


# --- the command --------------------------------------------------------------------------------


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("rebind", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_the_command_starts_shows_and_lists_a_drain(agent):
    in_flight(agent, 2)
    out, err = run("start", agent.slug, "--move-prefix", V1, V2, "--deadline", "1h")
    rebind = Rebind.objects.get(pk=out.strip())
    assert rebind.state == RebindState.DRAINING
    assert rebind.deadline_seconds == 3600
    assert "draining" in err
    shown, _ = run("show", str(rebind.pk))
    assert "tasks on the old version (2 shown)" in shown
    assert "cfg-0.v1" in shown
    as_json = json.loads(run("show", str(rebind.pk), "--json")[0])
    assert len(as_json["onOldVersion"]) == 2
    listed, _ = run("list", "--open")
    assert str(rebind.pk) in listed


def test_the_command_help_lists_and_describes_every_subcommand():
    # As an operator reads it: `manage.py rebind --help`, then each subcommand's own --help.
    subcommands = next(
        action
        for action in RebindCommand().create_parser("manage.py", "rebind")._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    helps = {a.dest: a.help for a in subcommands._choices_actions}
    assert set(helps) == set(subcommands.choices)
    assert set(helps) >= {"start", "schedule", "show", "list", "cutover", "abort", "extend"}
    listing = manage_py("rebind", "--help")
    flat = " ".join(listing.split())
    for name, text in helps.items():
        assert text, f"{name} has no help"
        assert f"{name} {' '.join(text.split())}" in flat, name
        own = " ".join(manage_py("rebind", name, "--help").split())
        assert " ".join(text.split()) in own, name
    assert "--no-wait" in manage_py("rebind", "start", "--help")


def manage_py(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_command_with_no_wait_returns_once_the_rebind_is_recorded(agent):
    in_flight(agent, 1)
    out, err = run("start", agent.slug, "--rotate-key", "--move-prefix", V1, V2, "--no-wait")
    rebind = Rebind.objects.get(pk=out.strip())
    # Recorded and left for beat's monitor: the new key published, not signing yet (without
    # --no-wait the command returns only once the drain has begun).
    assert rebind.state == RebindState.PREPARING
    assert rebind.activate_key_at > datetime.now(UTC)
    assert not ChannelMove.objects.filter(rebind=rebind).exists()
    assert "preparing (new key published, not signing yet)" in err
    assert f"Follow it: manage.py rebind show {rebind.pk}" in err
    assert rebind.activate_key_at.isoformat(timespec="seconds") in err
    assert rebind_advance(rebind.pk).state == RebindState.PREPARING  # nothing waited for it


def test_the_command_shows_states_by_their_labels_and_when_a_scheduled_one_starts(agent):
    in_flight(agent, 1)
    out, _ = run("schedule", agent.slug, "--rotate-key", "--at", "+15m")
    scheduled = Rebind.objects.get(pk=out.strip())
    starts = scheduled.scheduled_for.isoformat(timespec="seconds")
    listed, _ = run("list")
    [line] = [line for line in listed.splitlines() if str(scheduled.pk) in line]
    assert f"scheduled, starts {starts} (in " in line
    assert f"scheduled, starts {starts}" in run("show", str(scheduled.pk))[0]
    run("abort", str(scheduled.pk), "--reason", "not now")

    out, _ = run("start", agent.slug, "--move-prefix", V1, V2, "--policy", "cutover")
    cut = Rebind.objects.get(pk=out.strip())
    assert cut.state == RebindState.CUT_OVER
    listed, _ = run("list")
    assert f"rebind {cut.pk} [{agent.slug}] cut over (" in listed
    assert "cut_over" not in listed
    assert f"rebind {scheduled.pk} [{agent.slug}] aborted (" in listed
    shown, _ = run("show", str(cut.pk))
    assert "  state: cut over" in shown.splitlines()
    # JSON keeps the stored value, as the API does.
    assert json.loads(run("show", str(cut.pk), "--json")[0])["state"] == "cut_over"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["start", "nobody", "--rotate-key"], "no agent 'nobody'"),
        (["start", "hooks", "--move-prefix", V2, V1], "matches no push config"),
        (["show", "not-a-uuid"], "no rebind not-a-uuid"),
        (["abort", "00000000-0000-0000-0000-000000000000", "--reason", "x"], "no rebind"),
        (["start", "hooks", "--rotate-key", "--deadline", "soon"], "not a duration"),
        (["schedule", "hooks", "--rotate-key", "--at", "yesterday"], "ISO 8601"),
    ],
)
def test_the_command_refuses_bad_input_with_the_reason_and_changes_nothing(agent, args, says):
    in_flight(agent, 1)
    before = rows()
    with pytest.raises(CommandError) as refused:
        run(*args)
    assert says in str(refused.value)
    # A refused rebind exits 2; a malformed argument is the parser's usage error.
    assert refused.value.returncode == (1 if "--deadline" in args or "--at" in args else 2)
    assert rows() == before


def test_replacing_one_configs_credentials_drains_that_config_alone(agent):
    a, b = in_flight(agent, 2)
    deliver_all()
    config = PushConfig.objects.get(task=a)
    rebind = rebind_start(
        RebindRequest(
            agent=agent,
            config=config,
            new_token="tok-2",
            new_auth_scheme="Bearer",
            new_credentials="cred-2",
        ),
        actor="ops",
    )
    assert rebind.counts["noticePending"] == 1
    deliver_all()
    v2 = config.bindings.get(version=2)
    assert (v2.url, decrypt(v2.token_encrypted), v2.auth_scheme) == (
        f"{V1}task-0",
        "tok-2",
        "Bearer",
    )
    assert decrypt(v2.credentials_encrypted) == "cred-2"
    assert v2.activated_at is not None
    assert PushConfig.objects.get(task=b).current_version == 1
    assert rebind_advance(rebind.pk).state == RebindState.COMPLETED


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"new_token": "line\nbreak"}, "new_token"),
        ({"new_auth_scheme": "Bad Scheme"}, "new_authentication.scheme"),
        ({"new_credentials": "c"}, "new_authentication.scheme"),
    ],
)
def test_bad_new_credentials_are_refused(agent, kw, field):
    [task] = in_flight(agent, 1)
    before = rows()
    with pytest.raises(RebindInvalid) as refused:
        rebind_start(
            RebindRequest(agent=agent, config=PushConfig.objects.get(task=task), **kw),
            actor="ops",
        )
    assert refused.value.field == field
    assert rows() == before


def test_a_config_deleted_mid_drain_ends_its_move_and_its_held_deliveries(agent):
    a, b = in_flight(agent, 2)
    deliver_all()
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    services.task_transition(task_id=a.pk, to_state=TaskState.INPUT_REQUIRED)
    delete(agent, a.pk, "cfg-0")
    assert set(Delivery.objects.filter(task=a, seq=3).values_list("state", flat=True)) == {
        DeliveryState.CANCELED
    }
    deliver_all()  # b's notice
    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.COMPLETED
    assert rebind.counts["onOldVersionTotal"] == 0


# --- the console's wizard -----------------------------------------------------------------------


def wizard_post(client, **data):
    return client.post("/admin/webhooks/rebind/start/", {"agent": "hooks", **data}, follow=True)


def test_the_wizard_previews_the_blast_radius_then_starts_on_confirmation(agent, admin_client):
    in_flight(agent, 2)
    in_flight(agent, 1, state=TaskState.INPUT_REQUIRED, prefix=V1 + "x/")
    assert admin_client.get("/admin/webhooks/rebind/start/").status_code == 200
    fields = {"operations": ["move_prefix"], "move_from": V1, "move_to": V2, "deadline": "1h"}
    preview = wizard_post(admin_client, **fields)
    page = preview.content.decode()
    assert "Confirm the rebind" in page
    assert "In-flight tasks on the old version: 3; input-required 1; working 2" in page
    assert "https://client.example.org:443" in page
    assert not Rebind.objects.exists()  # nothing written before the confirmation
    started = wizard_post(admin_client, **fields, confirm="yes")
    rebind = Rebind.objects.get()
    assert started.redirect_chain[-1][0] == f"/admin/webhooks/rebind/{rebind.pk}/change/"
    assert (rebind.state, rebind.deadline_seconds, rebind.actor) == ("draining", 3600, "admin")
    # A rotation over the channels it moves: shown as the conflict, and no confirm button.
    again = wizard_post(admin_client, operations=["rotate_key"]).content.decode()
    assert f"rebind {rebind.pk} is still open over the same scope" in again
    assert 'id="rebind-confirm"' not in again


def test_the_wizard_shows_a_refused_request_on_its_form_and_writes_nothing(agent, admin_client):
    in_flight(agent, 1)
    before = rows()
    answer = wizard_post(
        admin_client,
        operations=["move_prefix"],
        move_from="https://client.example.org/nowhere/",
        move_to=V2,
        confirm="yes",
    )
    assert "matches no push config of agent" in answer.content.decode()
    answer = wizard_post(admin_client, operations=["rotate_key"], deadline="soon")
    assert "is not a duration" in answer.content.decode()
    assert rows() == before


def test_without_the_run_rebind_permission_the_wizard_and_cutover_are_refused(agent, client):
    viewer = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_rebind"))
    client.force_login(viewer)
    assert client.get("/admin/webhooks/rebind/start/").status_code == 403
    listing = client.get("/admin/webhooks/rebind/")
    assert listing.status_code == 200
    assert "Start a rebind" not in listing.content.decode()
    assert 'value="cut_over"' not in listing.content.decode()


# --- per-task decisions -----------------------------------------------------------------------


def test_move_now_activates_without_the_notice_and_finish_on_old_keeps_the_old_channel(
    agent, admin_client
):
    a, b = in_flight(agent, 2)
    deliver_all()
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    move_a = ChannelMove.objects.get(task=a)
    move_b = ChannelMove.objects.get(task=b)
    answer = admin_client.post(
        "/admin/webhooks/channelmove/",
        {"action": "move_now", "_selected_action": [str(move_a.pk)]},
        follow=True,
    )
    assert f"Rebind {rebind.pk}: 1 moved" in answer.content.decode()  # the admin capitalises
    assert rebind_moves_finish_on_old(rebind.pk, move_pks=[move_b.pk], actor="ops") == 1
    services.task_transition(task_id=a.pk, to_state=TaskState.COMPLETED)
    services.task_transition(task_id=b.pk, to_state=TaskState.COMPLETED)
    sent = deliver_all()
    assert sent == [(f"{V2}task-0", "status", 3), (f"{V1}task-1", "status", 3)]  # no notice
    notices = Delivery.objects.filter(kind="notice")
    assert set(notices.values_list("state", flat=True)) == {DeliveryState.SUPERSEDED}
    rebind = rebind_advance(rebind.pk)
    assert rebind.state == RebindState.COMPLETED
    assert (rebind.counts["moved"], rebind.counts["finishedOnOld"]) == (1, 1)
    listing = admin_client.get(f"/admin/webhooks/channelmove/?rebind__id__exact={rebind.pk}")
    assert listing.status_code == 200


def test_the_operator_groups_grant_what_their_names_say(agent, client):
    sync_groups()  # as after every migrate (idempotent)
    sync_groups()
    perms = {
        g.name: set(g.permissions.values_list("codename", flat=True))
        for g in Group.objects.filter(name__in=["viewer", "operator", "rebind operator"])
    }
    assert "view_rebind" in perms["viewer"]
    assert not any(p.startswith(("change_", "add_", "delete_")) for p in perms["viewer"])
    assert {"change_delivery", "change_endpoint"} <= perms["operator"]
    assert "run_rebind" not in perms["operator"]
    assert perms["rebind operator"] == perms["operator"] | {"run_rebind"}
    user = get_user_model().objects.create_user("ops", password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name="rebind operator"))
    client.force_login(user)
    assert client.get("/admin/webhooks/rebind/start/").status_code == 200
    viewer = get_user_model().objects.create_user("eyes", password="pw", is_staff=True)
    viewer.groups.add(Group.objects.get(name="viewer"))
    client.force_login(viewer)
    assert client.get("/admin/webhooks/rebind/start/").status_code == 403
    assert client.get("/admin/webhooks/delivery/").status_code == 200
