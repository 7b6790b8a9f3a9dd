"""The rebind's console page and its JSON view (issue 16; Django's test client, PostgreSQL).

The JSON view (admin/webhooks/rebind/<pk>/live/, polled by the page) answers the rebind's
state, policy, scope, progress, deadline, which actions are legal, and each task still on
the old version with its notice and the last delivery on its old channel, in a bounded
number of queries; it checks the view permission. The actions confirm first and only the
confirmed POST calls the rebind service; they need run_rebind, and an illegal transition or
bad input comes back as a message. Everything is written by the services.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages

from tasks import services
from tasks.states import TaskState
from tests.factories import AgentFactory, user_message
from webhooks.models import ChannelMove, Delivery, MoveState, OperatorAction, Rebind
from webhooks.rebind import rebind_abort, rebind_start
from webhooks.rebind_checks import RebindRequest
from webhooks.services import push_config_create

pytestmark = pytest.mark.usefixtures("public_dns")

V1 = "https://hooks.example.org/v1/"
V2 = "https://hooks.example.org/v2/"
REBINDS = "/admin/webhooks/rebind/"


@pytest.fixture
def agent(db):
    return AgentFactory(slug="shop-bot", executor="external")


def staff(client, username: str, codenames: list[str]):
    user = get_user_model().objects.create_user(username, password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)
    return client


def in_flight(agent, n: int, prefix: str = V1) -> list[str]:
    ids = []
    for i in range(n):
        task = services.task_create(agent=agent, owner="o", message=user_message("hi"))
        push_config_create(task=task, config={"id": f"c{i}", "url": f"{prefix}t{i}"})
        services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
        ids.append(str(task.id))
    return ids


def draining(agent, n: int = 3):
    ids = in_flight(agent, n)
    rebind = rebind_start(
        RebindRequest(agent=agent, move_from=V1, move_to=V2, deadline_seconds=3600), actor="ops"
    )
    assert rebind.state == "draining"
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
    assert data["progress"] == {
        "start": 3,
        "left": 3,
        "moved": 0,
        "orphaned": 0,
        "planningDone": True,
        "percent": 0,
    }
    assert data["actions"] == {
        "move_now": True,
        "finish_on_old": True,
        "cut_over": True,
        "extend": True,
        "abort": True,
    }
    rows = data["onOld"]
    assert [r["task"] for r in rows] == ids  # oldest move first
    assert [r["taskState"] for r in rows] == ["working", "input-required", "working"]
    assert data["onOldTotal"] == 3
    for row, task_id in zip(rows, ids, strict=True):
        move = ChannelMove.objects.select_related("notice").get(rebind=rebind, task_id=task_id)
        assert row["move"] == move.pk
        assert row["moveState"] == MoveState.NOTICE_PENDING
        assert row["notice"] == {"state": move.notice.state, "lastError": ""}
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
    from webhooks.rebind import rebind_moves_now

    assert rebind_moves_now(rebind.pk, move_pks=[move.pk], actor="ops") == 1

    data = live(superuser, rebind).json()
    assert [r["task"] for r in data["onOld"]] == [ids[2]]
    assert (data["progress"]["start"], data["progress"]["left"]) == (3, 1)
    assert data["progress"]["percent"] == 66

    rebind_abort(rebind.pk, actor="ops", reason="test")
    data = live(superuser, rebind).json()
    assert data["state"] == "aborted"
    assert data["onOld"] == []
    assert not any(data["actions"].values())


@pytest.mark.parametrize("tasks", [2, 20])
def test_live_view_queries_do_not_grow_with_the_list(
    agent, superuser, tasks, django_assert_max_num_queries
):
    rebind, _ = draining(agent, tasks)
    # Session, user, the rebind, its agent, progress, the list, its last deliveries: 7 for
    # 2 rows as for 20 (a query per row would be 20 more).
    with django_assert_max_num_queries(7):
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
    assert 'class="form-row field-state"' in html  # the stock read-only form stays below

    for action in ("move_now", "finish_on_old", "cut_over", "extend", "abort"):
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
    done = superuser.post(f"{base}cut_over/", {"confirm": "yes"})
    assert texts(done)[-1] == f"rebind {rebind.pk}: cut over (cut_over)"
    assert Rebind.objects.get(pk=rebind.pk).state == "cut_over"

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
