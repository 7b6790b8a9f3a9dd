"""The rebind's console page and its JSON view (issues 16 and 43; Django's test client,
PostgreSQL).

The JSON view (admin/webhooks/rebind/<pk>/live/, polled by the page) is the page's one source:
the title, state, facts and counts, progress (its tone: only a completed rebind reads as a
success), the deadline (counting only while open), which actions are legal, each task still on
the old version with its notice (a dead-lettered one with the receiver's status and body) and
the last delivery on its old channel, and every move, in a bounded number of queries; it checks
the view permission. The actions confirm first and only the confirmed POST calls the service;
they need run_rebind, and an illegal transition or bad input comes back as a message. A dead
notice is replayed from the page through the deliveries admin's replay; the task's page shows
it dead with the receiver's answer.

Tasks and push configs are made through the protocol (tests/protocol_push.py), as a client
makes them; deliveries are claimed, really sent to a receiver in this process and recorded by
the delivery services.
"""

from __future__ import annotations

import contextlib
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory
from tests.protocol_push import open_task
from webhooks.delivery.transport import post
from webhooks.models import (
    ChannelMove,
    Delivery,
    DeliveryState,
    MoveState,
    PushConfig,
    Rebind,
)
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_abort, rebind_advance, rebind_start

pytestmark = pytest.mark.usefixtures("public_dns", "transactional_db", "fresh_transport")

V1 = "https://hooks.example.org/v1/"
V2 = "https://hooks.example.org/v2/"
REBINDS = "/admin/webhooks/rebind/"
REFUSAL = '{"error": "unknown extension urn:a2a-platform:ext:push-channel:v1"}'


@pytest.fixture
def agent(transactional_db):
    return AgentFactory(slug="shop-bot", executor="external")


def staff(client, username: str, codenames: list[str]):
    user = get_user_model().objects.create_user(username, password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def in_flight(agent, n: int, prefix: str = V1) -> list[str]:
    """n WORKING tasks opened through the protocol, each with one push config under `prefix`."""
    ids = []
    for i in range(n):
        task_id = open_task(agent, push={"id": f"cfg-{i}", "url": f"{prefix}t{i}"})
        services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
        ids.append(task_id)
    return ids


def draining(agent, n: int = 3, prefix: str = V1, to: str = V2):
    ids = in_flight(agent, n, prefix)
    rebind = rebind_start(
        RebindRequest(agent=agent, move_from=prefix, move_to=to, deadline_seconds=3600),
        actor="ops",
    )
    assert rebind.state == "draining", rebind.reason
    return rebind, ids


class Receiver:
    """The client's receiver (the far side we do not own), in this process: it answers a
    channel notice with `notice_status` and REFUSAL, everything else 200."""

    def __init__(self) -> None:
        self.notice_status = 400
        self.notices = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body = 200, b"{}"
                if self.headers.get("X-A2A-Event-Kind") == "notice":
                    receiver.notices += 1
                    status, body = receiver.notice_status, REFUSAL.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def prefix(self, version: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/{version}/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


def deliver_due(task_ids: list[str]) -> None:
    """What a delivery worker does for these tasks' configs: claim each due head, send it to
    the receiver for real, record the answer; until nothing of theirs is due."""
    for config_pk in PushConfig.objects.filter(task_id__in=task_ids).values_list("pk", flat=True):
        while (claim := delivery_claim_head(config_pk=config_pk)) is not None:
            answer = post(claim.url, claim.body, claim.headers, timeout=5)
            delivery_record(claim=claim, result=answer)


def stuck_drain(agent, receiver, n: int = 2):
    """A drain whose notices the receiver refuses (400): every task stays on the old version."""
    rebind, ids = draining(agent, n, receiver.prefix("v1"), receiver.prefix("v2"))
    deliver_due(ids)
    notices = Delivery.objects.filter(task_id__in=ids, kind="notice")
    assert sorted(notices.values_list("state", flat=True)) == [DeliveryState.DEAD] * n
    return rebind, ids


def live(client, rebind):
    return client.get(f"{REBINDS}{rebind.pk}/live/")


def texts(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_live_view_shape(agent, superuser):
    rebind, ids = draining(agent)
    services.task_transition(task_id=ids[1], to_state=TaskState.INPUT_REQUIRED)

    response = live(superuser, rebind)

    assert response.status_code == 200
    assert response["Cache-Control"].startswith("no-store")
    data = response.json()
    rebind.refresh_from_db()
    assert data["id"] == str(rebind.pk)
    assert (data["state"], data["policy"], data["agent"]) == ("draining", rebind.policy, "shop-bot")
    assert data["scope"] == f"{V1} → {V2}"
    assert data["deadline"] == rebind.deadline.isoformat()
    assert data["title"] == "Rebind of shop-bot: draining"
    assert data["stateLabel"] == "draining"
    assert data["deadlineRunning"] is True
    assert data["inFlight"] == "move once their notice on the old channel is delivered (drain)"
    assert data["progress"] == {
        "start": 3,
        "left": 3,
        "moved": 0,
        "orphaned": 0,
        "stuck": 0,
        "planningDone": True,
        "percent": 0,
        "tone": "open",
        "text": "3 of 3 left on the old version",
    }
    # The counts are selectors.rebind_counts' (the API's and the shell's), in the same payload.
    assert data["counts"]["onOldVersionTotal"] == 3
    assert data["counts"]["notices"] == {"delivered": 0, "pending": 3, "dead": 0, "superseded": 0}
    assert data["actions"] == {
        "move_now": True,
        "finish_on_old": True,
        "cut_over": True,
        "extend": True,
        "abort": True,
        "replay_notice": True,
    }
    assert [m["task"] for m in data["moves"]] == ids
    assert {m["stateLabel"] for m in data["moves"]} == {"notice pending on the old channel"}
    assert data["movesTotal"] == 3
    rows = data["onOld"]
    assert [r["task"] for r in rows] == ids  # oldest move first
    assert [r["taskState"] for r in rows] == ["working", "input-required", "working"]
    assert data["onOldTotal"] == 3
    for row, task_id in zip(rows, ids, strict=True):
        move = ChannelMove.objects.select_related("notice").get(rebind=rebind, task_id=task_id)
        assert row["move"] == move.pk
        assert row["moveState"] == MoveState.NOTICE_PENDING
        assert row["stuck"] is False
        assert row["notice"] == {
            "id": str(move.notice.event_id),
            "state": "pending",
            "stateLabel": "pending",
            "dead": False,
            "attempts": 0,
            "lastError": "",
            "answer": None,
        }
        # The newest delivery on the old binding other than the notice: the last status.
        last = Delivery.objects.filter(binding=move.old_binding).exclude(kind="notice").latest("id")
        assert row["lastDelivery"] == {
            "kind": "status",
            "state": last.state,
            "at": (last.finished_at or last.created_at).isoformat(),
            "status": None,
            "error": "",
        }
        assert row["since"] == move.created_at.isoformat()
        assert row["sinceSeconds"] >= 0
        assert row["oldVersion"] == f"{move.config.config_id}.v1"


def test_rows_leave_as_tasks_move_or_finish(agent, superuser):
    rebind, ids = draining(agent)
    services.task_transition(task_id=ids[0], to_state=TaskState.COMPLETED)
    move = ChannelMove.objects.get(rebind=rebind, task_id=ids[1])
    from webhooks.rebinds.operations import rebind_moves_now

    assert rebind_moves_now(rebind.pk, move_pks=[move.pk], actor="ops") == 1

    data = live(superuser, rebind).json()
    # ChannelMove.objects.on_old(): a move waiting for its notice stays listed whatever its task's
    # state (what the task emitted meanwhile is held until the notice is delivered).
    assert [r["task"] for r in data["onOld"]] == [ids[0], ids[2]]
    assert [r["taskState"] for r in data["onOld"]] == ["completed", "working"]
    assert (data["progress"]["start"], data["progress"]["left"]) == (3, 2)
    assert data["progress"]["percent"] == 33

    rebind_abort(rebind.pk, actor="ops", reason="test")
    data = live(superuser, rebind).json()
    assert data["state"] == "aborted"
    assert data["onOld"] == []
    assert not any(data["actions"].values())
    # Aborted is not a success: no full bar, no countdown, and it says what it left behind.
    assert data["title"] == "Rebind of shop-bot: aborted"
    assert data["deadlineRunning"] is False
    assert data["progress"]["tone"] == "aborted"
    assert data["progress"]["percent"] == 33  # the one task moved, of three
    assert data["progress"]["text"] == "aborted: 1 task moved, 2 returned to the old channel"
    assert [m["state"] for m in data["moves"]] == ["reverted", "moved", "reverted"]
    assert "draining" not in json.dumps(data)


@pytest.mark.parametrize("tasks", [2, 20])
def test_live_view_queries_do_not_grow_with_the_list(
    agent, superuser, tasks, django_assert_max_num_queries
):
    rebind, _ = draining(agent, tasks)
    # Session, user, the admin's rebind; then one snapshot: its isolation, the rebind with its
    # agent, the counts (3), progress, the list and its last deliveries, every move; 14 in all
    # for 2 rows as for 20 (a query per row would be 20 more).
    with django_assert_max_num_queries(14):
        response = live(superuser, rebind)
    assert len(response.json()["onOld"]) == tasks


def test_live_view_permissions(agent, client):
    rebind, _ = draining(agent, 1)
    anonymous = live(client, rebind)
    assert anonymous.status_code == 302
    assert "/admin/login/" in anonymous["Location"]

    staff(client, "nobody", [])
    assert live(client, rebind).status_code == 403

    staff(client, "viewer", ["view_rebind"])
    assert live(client, rebind).status_code == 200
    assert client.get(f"{REBINDS}00000000-0000-0000-0000-000000000000/live/").status_code == 404
    assert client.get(f"{REBINDS}not-a-uuid/live/").status_code == 404


def test_page_shows_the_console_and_buttons_only_with_run_rebind(agent, client):
    rebind, ids = draining(agent, 2)
    audited = OperatorAction.objects.count()
    staff(client, "viewer", ["view_rebind", "view_channelmove"])
    html = client.get(f"{REBINDS}{rebind.pk}/change/").content.decode()
    assert 'id="rebind-console"' in html
    assert f'data-url="{REBINDS}{rebind.pk}/live/"' in html
    assert ids[0] in html  # the embedded data the list is rendered from
    assert 'id="rebind-buttons"' not in html
    assert 'id="rebind-move-now"' not in html
    assert 'id="rebind-replay-notices"' not in html
    # The stock read-only form stays below with the request as made; what changes as the
    # rebind runs is the console's (one payload), never a stale copy of the row.
    assert 'class="form-row field-move_from"' in html
    assert "field-state" not in html
    assert "field-counts" not in html
    assert 'class="inline-group"' not in html  # the moves are the console's list
    # "Finish on old: ✗" beside help reading as its opposite: said in words instead.
    assert "Finish on old" not in html
    assert "move once their notice on the old channel is delivered (drain)" in html
    assert '<h2 id="rebind-title">Rebind of shop-bot: draining</h2>' in html

    for action in ("move_now", "finish_on_old", "cut_over", "extend", "abort", "replay_notice"):
        url = f"{REBINDS}{rebind.pk}/do/{action}/"
        assert client.get(url).status_code == 403
        assert (
            client.post(url, {"confirm": "yes", "reason": "x", "minutes": "5"}).status_code == 403
        )
    assert Rebind.objects.get(pk=rebind.pk).state == "draining"
    assert OperatorAction.objects.count() == audited

    operator = staff(client, "rebinder", ["view_rebind", "run_rebind"])
    html = operator.get(f"{REBINDS}{rebind.pk}/change/").content.decode()
    assert 'id="rebind-buttons"' in html
    assert 'id="rebind-move-now" data-action="move_now"' in html


def test_move_now_confirms_then_moves_and_audits(agent, superuser):
    rebind, ids = draining(agent, 3)
    pks = list(
        ChannelMove.objects.filter(rebind=rebind, task_id__in=ids[:2]).values_list("pk", flat=True)
    )
    url = f"{REBINDS}{rebind.pk}/do/move_now/"

    page = superuser.post(url, {"move": [str(p) for p in pks]})
    assert page.status_code == 200
    html = page.content.decode()
    assert "Move 2 tasks now: " in html
    assert ids[0] in html
    assert ids[1] in html
    assert ids[2] not in html
    assert ChannelMove.objects.filter(pk__in=pks, state=MoveState.MOVED).count() == 0
    assert not OperatorAction.objects.filter(action="rebind_move_now").exists()

    done = superuser.post(url, {"move": [str(p) for p in pks], "confirm": "yes"})
    assert done.status_code == 302
    assert done["Location"] == f"{REBINDS}{rebind.pk}/change/"
    assert texts(done) == [f"rebind {rebind.pk}: 2 task(s) moved now"]
    assert ChannelMove.objects.filter(pk__in=pks, state=MoveState.MOVED).count() == 2
    audit = OperatorAction.objects.get(action="rebind_move_now")
    assert audit.actor == "admin"
    assert audit.target["moves"] == 2


def test_finish_on_old_extend_cut_over_and_abort(agent, superuser):
    rebind, ids = draining(agent, 3)
    move = ChannelMove.objects.get(rebind=rebind, task_id=ids[0])
    base = f"{REBINDS}{rebind.pk}/do/"

    html = superuser.post(f"{base}finish_on_old/", {"move": [str(move.pk)]}).content.decode()
    assert "Let 1 task finish on the old channel" in html
    superuser.post(f"{base}finish_on_old/", {"move": [str(move.pk)], "confirm": "yes"})
    move.refresh_from_db()
    assert move.state == MoveState.FINISHING_ON_OLD

    before = Rebind.objects.get(pk=rebind.pk).deadline
    html = superuser.post(f"{base}extend/", {"minutes": "45"}).content.decode()
    assert "Extend the deadline by 45 minutes: from " in html
    assert Rebind.objects.get(pk=rebind.pk).deadline == before
    superuser.post(f"{base}extend/", {"minutes": "45", "confirm": "yes"})
    assert Rebind.objects.get(pk=rebind.pk).deadline == before + timedelta(minutes=45)
    assert OperatorAction.objects.get(action="rebind_extend").target["seconds"] == 2700

    html = superuser.get(f"{base}cut_over/").content.decode()
    assert "Cut over: 3 tasks still on old will be orphaned" in html
    # Exactly what it switches: this rebind moves URLs and rotates no key.
    assert "the new channel takes every other delivery from now on (the signing key stays)" in (
        html
    )
    assert "new key" not in html
    done = superuser.post(f"{base}cut_over/", {"confirm": "yes"})
    assert texts(done)[-1] == f"rebind {rebind.pk}: cut over"
    assert Rebind.objects.get(pk=rebind.pk).state == "cut_over"
    data = live(superuser, rebind).json()
    assert (data["stateLabel"], data["deadlineRunning"]) == ("cut over", False)
    assert data["progress"]["tone"] == "cut_over"
    assert data["progress"]["percent"] == 0  # nothing moved: never a full bar
    assert data["progress"]["text"] == (
        "cut over: 0 tasks moved, 3 orphaned (waiting to be re-bound)"
    )
    listing = superuser.get(REBINDS).content.decode()
    assert '<td class="field-state">cut over</td>' in listing

    # An illegal transition is a message, never a 500: abort a cut-over rebind.
    refused = superuser.post(f"{base}abort/", {"reason": "late", "confirm": "yes"})
    assert refused.status_code == 302
    assert texts(refused)[-1] == (
        f"rebind {rebind.pk}: cannot abort a rebind that is cut over "
        "(only when draining or preparing or scheduled)"
    )
    assert not OperatorAction.objects.filter(action="rebind_abort").exists()


def test_abort_needs_a_reason_and_records_it(agent, superuser):
    rebind, _ = draining(agent, 1)
    url = f"{REBINDS}{rebind.pk}/do/abort/"
    refused = superuser.post(url, {"reason": "  ", "confirm": "yes"})
    assert texts(refused) == [
        f"rebind {rebind.pk}: say why the rebind is aborted (a reason is recorded)"
    ]
    html = superuser.post(url, {"reason": "wrong prefix"}).content.decode()
    assert "Abort: 1 task still on old stay on their old channel" in html
    assert "reason recorded: wrong prefix" in html
    superuser.post(url, {"reason": "wrong prefix", "confirm": "yes"})
    assert Rebind.objects.get(pk=rebind.pk).state == "aborted"
    assert OperatorAction.objects.get(action="rebind_abort").target["reason"] == "wrong prefix"


@pytest.mark.parametrize(
    ("action", "data", "message"),
    [
        ("extend", {"minutes": "soon"}, "extend by a whole number of minutes from 1 to 43200"),
        ("extend", {"minutes": "0"}, "extend by a whole number of minutes from 1 to 43200"),
        ("extend", {"minutes": "99999999"}, "extend by a whole number of minutes from 1 to"),
        ("move_now", {}, "select at least one task still on the old version"),
        ("move_now", {"move": ["x"]}, "the selection is malformed: reload the page"),
        ("move_now", {"move": ["999999"]}, "none of the selected tasks is still on the old"),
        ("abort", {"reason": "x" * 301}, "the reason must be at most 300 characters"),
        ("abort", {"reason": "a\x00b"}, "the reason cannot contain a NUL character"),
    ],
)
def test_bad_input_is_a_message(agent, superuser, action, data, message):
    rebind, _ = draining(agent, 1)
    audited = OperatorAction.objects.count()
    response = superuser.post(f"{REBINDS}{rebind.pk}/do/{action}/", {**data, "confirm": "yes"})
    assert response.status_code == 302
    [text] = texts(response)
    assert text.startswith(f"rebind {rebind.pk}: {message}"), text
    assert Rebind.objects.get(pk=rebind.pk).state == "draining"
    assert OperatorAction.objects.count() == audited


def test_unknown_action_or_rebind_is_404(agent, superuser):
    rebind, _ = draining(agent, 1)
    assert superuser.get(f"{REBINDS}{rebind.pk}/do/explode/").status_code == 404
    unknown = "00000000-0000-0000-0000-000000000000"
    assert superuser.get(f"{REBINDS}{unknown}/do/abort/").status_code == 404


def test_a_dead_notice_shows_as_stuck_with_the_receivers_answer(agent, superuser, receiver):
    rebind, ids = stuck_drain(agent, receiver)

    data = live(superuser, rebind).json()
    assert data["progress"]["stuck"] == 2
    assert data["counts"]["notices"]["dead"] == 2
    assert data["actions"]["replay_notice"] is True
    for row in data["onOld"]:
        assert row["stuck"] is True
        assert row["moveStateLabel"] == "stuck on the old channel: its notice was dead-lettered"
        notice = row["notice"]
        assert (notice["state"], notice["stateLabel"], notice["dead"]) == (
            "dead",
            "dead-lettered",
            True,
        )
        assert notice["answer"] == {
            "status": 400,
            "excerpt": REFUSAL,
            "detail": notice["answer"]["detail"],
        }
    for move in data["moves"]:
        assert move["stateLabel"] == "stuck on the old channel: its notice was dead-lettered"
        assert move["notice"]["answer"]["status"] == 400

    # The task's own page: its channel history says the move is stuck and what the receiver
    # answered (not "last error: -").
    html = superuser.get(f"/admin/tasks/task/{ids[0]}/change/").content.decode()
    assert "stuck on the old channel: its notice was dead-lettered" in html
    assert '<td class="a2a-dead">dead-lettered</td>' in html
    assert '<td class="c-answer">HTTP 400: {&quot;error&quot;: &quot;unknown extension' in html

    # The moves' list (ChannelMoveAdmin) too.
    moves = superuser.get(f"/admin/webhooks/channelmove/?rebind__id__exact={rebind.pk}")
    assert "dead-lettered (HTTP 400): task stuck on old" in moves.content.decode()


def test_replay_notice_confirms_then_replays_through_the_deliveries_replay(
    agent, superuser, receiver
):
    rebind, ids = stuck_drain(agent, receiver)
    first, second = (
        ChannelMove.objects.filter(rebind=rebind).select_related("notice").order_by("id")
    )
    url = f"{REBINDS}{rebind.pk}/do/replay_notice/"

    html = superuser.get(f"{REBINDS}{rebind.pk}/change/").content.decode()
    assert f'data-replay-url="{url}"' in html
    assert 'id="rebind-replay-notices"' in html

    # One row's button: its notice only, listed with the receiver's answer.
    page = superuser.post(url, {"only": str(first.pk), "move": [str(second.pk)]})
    assert page.status_code == 200
    html = page.content.decode()
    assert "Replay 1 dead-lettered notice: " in html
    assert ids[0] in html
    assert ids[1] not in html
    assert "HTTP 400: {&quot;error&quot;" in html
    assert Delivery.objects.get(pk=first.notice_id).state == DeliveryState.DEAD

    receiver.notice_status = 200  # the client fixed its receiver
    done = superuser.post(url, {"only": str(first.pk), "listed": [str(first.pk)], "confirm": "yes"})
    assert done.status_code == 302
    assert texts(done) == [f"rebind {rebind.pk}: 1 of 1 dead notice(s) replayed"]
    assert Delivery.objects.get(pk=first.notice_id).state == DeliveryState.PENDING
    assert Delivery.objects.get(pk=second.notice_id).state == DeliveryState.DEAD
    # Audited by the one replay (services.delivery_replay), as the deliveries admin's.
    audit = OperatorAction.objects.get(action="replay_deliveries")
    assert (audit.actor, audit.target) == ("admin", {"deliveries": [str(first.notice.event_id)]})

    deliver_due(ids)  # the notice is delivered now: its task moves
    first.refresh_from_db()
    assert first.state == MoveState.MOVED
    data = live(superuser, rebind).json()
    assert [r["task"] for r in data["onOld"]] == [ids[1]]
    assert data["progress"]["stuck"] == 1

    # "Replay dead notices": every one still dead (here the other one).
    html = superuser.post(url, {"move": [str(second.pk)]}).content.decode()
    assert "Replay 1 dead-lettered notice: " in html
    assert ids[1] in html
    superuser.post(url, {"listed": [str(second.pk)], "confirm": "yes"})
    deliver_due(ids)
    rebind_advance(rebind.pk)
    data = live(superuser, rebind).json()
    assert (data["state"], data["stateLabel"], data["deadlineRunning"]) == (
        "completed",
        "completed",
        False,
    )
    assert data["title"] == "Rebind of shop-bot: completed"
    assert (data["progress"]["tone"], data["progress"]["percent"]) == ("done", 100)
    assert data["progress"]["text"] == "completed: 2 tasks moved"
    assert data["onOld"] == []
    assert {m["stateLabel"] for m in data["moves"]} == {"moved to the new channel"}
    # After completion nothing on the page still says "draining" (title, state, lists).
    assert "draining" not in json.dumps(data)
    page = superuser.get(f"{REBINDS}{rebind.pk}/change/").content.decode()
    assert "draining" not in page
    assert "<title>Rebind of shop-bot: completed | " in page

    # Nothing left to replay: a message, nothing sent.
    refused = superuser.post(url, {"confirm": "yes"})
    assert texts(refused)[-1].startswith(f"rebind {rebind.pk}: a notice is replayed only while")
    assert OperatorAction.objects.filter(action="replay_deliveries").count() == 2


def test_replay_notice_needs_run_rebind_and_a_dead_notice(agent, client, receiver):
    rebind, _ = stuck_drain(agent, receiver, 1)
    move = ChannelMove.objects.get(rebind=rebind)
    url = f"{REBINDS}{rebind.pk}/do/replay_notice/"
    # The deliveries admin's own replay permission is not the rebind page's decision.
    staff(client, "delivery-operator", ["view_rebind", "view_delivery", "change_delivery"])
    assert client.get(url).status_code == 403
    assert client.post(url, {"only": str(move.pk), "confirm": "yes"}).status_code == 403
    html = client.get(f"{REBINDS}{rebind.pk}/change/").content.decode()
    assert 'id="rebind-replay-notices"' not in html
    assert Delivery.objects.get(pk=move.notice_id).state == DeliveryState.DEAD
    assert not OperatorAction.objects.filter(action="replay_deliveries").exists()

    staff(client, "rebinder", ["view_rebind", "run_rebind"])
    refused = client.post(url, {"only": "999999", "confirm": "yes"})
    assert texts(refused) == [
        f"rebind {rebind.pk}: no notice of this rebind is dead-lettered now (replayed, "
        "delivered, or its task left the old version)"
    ]
    done = client.post(url, {"only": str(move.pk), "confirm": "yes"})
    assert texts(done)[-1] == f"rebind {rebind.pk}: 1 of 1 dead notice(s) replayed"
    assert OperatorAction.objects.get(action="replay_deliveries").actor == "rebinder"


def test_the_live_payload_and_the_page_agree_on_state_labels(agent, superuser):
    rebind, _ = draining(agent, 1)
    rebind_abort(rebind.pk, actor="ops", reason="wrong prefix")
    html = superuser.get(f"{REBINDS}{rebind.pk}/change/").content.decode()
    assert '<h2 id="rebind-title">Rebind of shop-bot: aborted</h2>' in html
    assert "aborted: 0 tasks moved, 1 returned to the old channel" in html
    assert 'class="rb-tone-aborted"' in html
    assert 'data-deadline=""' in html  # nothing counts down on an ended rebind
