"""The operators' dashboard (webhooks/console/dashboard.py, its JSON view and the admin index): its
figures against the rows they are computed from, who may see them, and how many queries it
takes (Django's test client, PostgreSQL, the clock frozen)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents import readiness
from agents.models import Agent, WebInstance
from tasks import services
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message
from tests.readiness_helpers import mark_workers_live, readiness_reset
from webhooks.console import dashboard
from webhooks.models import (
    Alert,
    AlertKind,
    ChannelMove,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    MoveState,
    PushConfig,
    Rebind,
    RebindState,
)
from webhooks.services import endpoint_pause, push_config_create

pytestmark = pytest.mark.usefixtures("public_dns")

NOW = datetime(2026, 12, 1, 12, 30, 30, tzinfo=UTC)
WINDOW_START = datetime(2026, 12, 1, 11, 31, tzinfo=UTC)  # the chart's first minute
JSON = "/admin/dashboard.json"


@dataclass(frozen=True)
class Scene:
    rebind_id: str


def registered(agent, config_id: str, url: str) -> PushConfig:
    task = task_create(agent=agent, owner="owner", message=user_message("hi"))
    return push_config_create(task=task, config={"id": config_id, "url": url}).config


def snapshot_of(config: PushConfig) -> Delivery:
    return Delivery.objects.get(config=config)


def attempt(delivery: Delivery, at: datetime, status: int | None, *, error: str = "") -> None:
    """A finished attempt (its duration is recorded when the send returns)."""
    DeliveryAttempt.objects.create(
        delivery=delivery,
        number=DeliveryAttempt.objects.filter(delivery=delivery).count() + 1,
        url="https://hooks.example.org/a2a",
        started_at=at,
        duration_ms=5.0,
        status=status,
        error_class=error,
    )


def build_scene(time_machine) -> Scene:
    """shop-bot: two pending (5 min and 1 min old), one sending (2 min old), one held, two
    dead; attempts across the hour. other-bot: one pending. quiet-bot: nothing. mover-bot: an
    open rebind of five moves (two done, one live task on the old version) and a finished
    one."""
    shop = AgentFactory(slug="shop-bot", executor="external")
    other = AgentFactory(slug="other-bot", executor="external")
    AgentFactory(slug="quiet-bot", executor="external")
    mover = AgentFactory(slug="mover-bot", executor="external")

    time_machine.move_to(NOW - timedelta(minutes=5), tick=False)
    oldest = snapshot_of(registered(shop, "a", "https://hooks.example.org/a2a"))
    time_machine.move_to(NOW - timedelta(minutes=2), tick=False)
    sending = snapshot_of(registered(shop, "b", "https://hooks.example.org/a2a"))
    time_machine.move_to(NOW - timedelta(minutes=1), tick=False)
    snapshot_of(registered(shop, "c", "https://hooks.example.org/a2a"))
    held = snapshot_of(registered(shop, "d", "https://hooks.example.org/a2a"))
    dead = [
        snapshot_of(registered(shop, f"dead{n}", "https://gone.example.org/hook")) for n in (1, 2)
    ]
    other_pending = snapshot_of(registered(other, "o", "https://other.example.org/hook"))
    time_machine.move_to(NOW, tick=False)
    mark_workers_live()
    Delivery.objects.filter(pk=sending.pk).update(state=DeliveryState.SENDING)
    Delivery.objects.filter(pk=held.pk).update(state=DeliveryState.HELD)
    Delivery.objects.filter(pk__in=[d.pk for d in dead]).update(state=DeliveryState.DEAD)
    assert oldest.created_at == NOW - timedelta(minutes=5)

    # shop-bot's attempts: minute 0 (11:31) one 200 and one timeout; minute 29 (12:00) a
    # 204, a 500 and a 302; minute 59 (12:30) one 201; outside the window or unfinished:
    # not counted.
    attempt(dead[0], WINDOW_START + timedelta(seconds=10), 200)
    attempt(dead[0], WINDOW_START + timedelta(seconds=50), None, error="timeout")
    attempt(dead[1], WINDOW_START + timedelta(minutes=29), 204)
    attempt(dead[1], WINDOW_START + timedelta(minutes=29, seconds=1), 500)
    attempt(dead[1], WINDOW_START + timedelta(minutes=29, seconds=59), 302)
    attempt(oldest, WINDOW_START + timedelta(minutes=59, seconds=5), 201)
    attempt(oldest, WINDOW_START - timedelta(seconds=1), 500)  # before the window
    DeliveryAttempt.objects.create(  # claimed, still in flight: no outcome yet
        delivery=sending, number=1, url="https://hooks.example.org/a2a", started_at=NOW
    )
    attempt(other_pending, WINDOW_START + timedelta(minutes=59), 503)

    gone = Endpoint.objects.get(origin="https://gone.example.org:443")
    Endpoint.objects.filter(pk=gone.pk).update(consecutive_failures=3, last_failure_at=NOW)
    paused = Endpoint.objects.get(origin="https://other.example.org:443")
    endpoint_pause(endpoint_pk=paused.pk, actor="setup", reason="receiver maintenance")
    Alert.objects.create(kind=AlertKind.DEAD_LETTER, endpoint=gone, message="first dead")
    Alert.objects.create(kind=AlertKind.ENDPOINT_FAILING, endpoint=gone, message="failing")
    Alert.objects.create(kind=AlertKind.DEAD_LETTER, message="old", resolved_at=NOW)

    moved = [registered(mover, f"m{n}", "https://old.example.org/hook") for n in range(5)]
    services.task_transition(task_id=moved[3].task_id, to_state=TaskState.COMPLETED)
    PushConfig.objects.filter(pk=moved[4].pk).update(deleted_at=NOW)
    rebind = Rebind.objects.create(
        agent=mover,
        move_from="https://old.example.org/",
        move_to="https://new.example.org/",
        policy="drain",
        state=RebindState.DRAINING,
        deadline_seconds=3600,
        deadline=NOW + timedelta(hours=1),
        on_timeout="cutover",
        actor="ops",
        moves_planned=True,
    )
    for config, state in zip(
        moved,
        [
            MoveState.MOVED,
            MoveState.FINISHED_ON_OLD,
            MoveState.NOTICE_PENDING,  # its task is live: on the old version
            MoveState.FINISHING_ON_OLD,  # its task completed: no longer counted
            MoveState.NOTICE_PENDING,  # its config was deleted: no longer counted
        ],
        strict=True,
    ):
        ChannelMove.objects.create(
            rebind=rebind,
            config=config,
            task_id=config.task_id,
            old_binding=config.bindings.get(),
            state=state,
        )
    Rebind.objects.create(
        agent=mover,
        policy="drain",
        state=RebindState.COMPLETED,
        deadline_seconds=60,
        on_timeout="cutover",
        actor="ops",
    )
    readiness_reset()
    return Scene(rebind_id=str(rebind.pk))


@pytest.fixture
def scene(db, time_machine) -> Scene:
    return build_scene(time_machine)


def staff(username: str, codenames: tuple[str, ...] = ()):
    user = get_user_model().objects.create_user(username, password="unused", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def by_slug(data: dict) -> dict[str, dict]:
    return {a["slug"]: a for a in data["agents"]}


def test_dashboard_figures_match_the_rows(scene):
    data = dashboard.dashboard_data()

    agents = by_slug(data)
    assert list(agents) == ["mover-bot", "other-bot", "quiet-bot", "shop-bot"]
    shop = agents["shop-bot"]["deliveries"]
    assert shop["queueDepth"] == 3  # a and c pending, b sending
    assert (shop["pending"], shop["sending"], shop["held"], shop["dead"]) == (2, 1, 1, 2)
    assert shop["oldestPendingAgeSeconds"] == 300.0
    assert shop["oldestPendingAt"] == (NOW - timedelta(minutes=5)).isoformat()
    delivered, failed = shop["perMinute"]["delivered"], shop["perMinute"]["failed"]
    assert len(delivered) == len(failed) == 60
    assert {i: n for i, n in enumerate(delivered) if n} == {0: 1, 29: 1, 59: 1}
    assert {i: n for i, n in enumerate(failed) if n} == {0: 1, 29: 2}
    assert shop["lastHour"] == {"delivered": 3, "failed": 3}
    other = agents["other-bot"]["deliveries"]
    assert (other["queueDepth"], other["dead"], other["oldestPendingAgeSeconds"]) == (1, 0, 60.0)
    assert {i: n for i, n in enumerate(other["perMinute"]["failed"]) if n} == {59: 1}
    quiet = agents["quiet-bot"]["deliveries"]
    assert (quiet["queueDepth"], quiet["oldestPendingAgeSeconds"]) == (0, None)
    assert quiet["lastHour"] == {"delivered": 0, "failed": 0}
    assert data["chart"] == {"start": WINDOW_START.isoformat(), "minutes": 60}
    # mover-bot: five snapshots and the completed task's status delivery.
    assert data["totals"] == {"queueDepth": 3 + 1 + 6, "held": 1, "dead": 2}

    assert (data["endpoints"]["failing"], data["endpoints"]["paused"]) == (1, 1)
    # Every endpoint is listed, the troubled first (failing, then paused), the healthy ones
    # with their last hour's figures: not "none" when nothing fails.
    listed = [e["origin"] for e in data["endpoints"]["rows"]]
    assert listed[:2] == ["https://gone.example.org:443", "https://other.example.org:443"]
    assert data["endpoints"]["total"] == len(listed) == Endpoint.objects.count()
    rows = {e["origin"]: e for e in data["endpoints"]["rows"]}
    assert rows["https://gone.example.org:443"]["state"] == "failing"
    assert rows["https://other.example.org:443"]["state"] == "paused"
    healthy = data["endpoints"]["rows"][2:]
    assert healthy
    assert {e["state"] for e in healthy} == {"ok"}
    for e in data["endpoints"]["rows"]:
        hour = DeliveryAttempt.objects.filter(
            delivery__binding__endpoint_id=e["id"],
            started_at__gte=NOW - timedelta(hours=1),
            duration_ms__isnull=False,
        )
        assert e["lastHour"]["attempts"] == hour.count(), e["origin"]
        assert e["lastHour"]["succeeded"] == hour.filter(status__gte=200, status__lt=300).count()
    assert rows["https://gone.example.org:443"]["consecutiveFailures"] == 3
    assert rows["https://other.example.org:443"]["pausedReason"] == "receiver maintenance"

    assert data["alerts"]["open"] == 2
    assert {a["message"] for a in data["alerts"]["newest"]} == {"first dead", "failing"}

    (rebind,) = data["rebinds"]
    assert rebind["id"] == scene.rebind_id
    assert (rebind["agent"], rebind["state"], rebind["policy"]) == (
        "mover-bot",
        "draining",
        "drain",
    )
    assert (rebind["done"], rebind["plannedMoves"], rebind["planningDone"]) == (2, 5, True)
    assert (rebind["progress"], rebind["percent"]) == (0.4, 40)
    assert rebind["onOldVersion"] == 1
    assert rebind["deadline"] == (NOW + timedelta(hours=1)).isoformat()
    assert rebind["deadlineInSeconds"] == 3600.0


def test_dashboard_readiness_shows_each_check_and_worker(scene):
    data = dashboard.dashboard_data()

    r = data["readiness"]
    checks = {c["name"]: c for c in r["checks"]}
    assert set(checks) >= {"database", "migrations", "agents_worker", "delivery_worker", "broker"}
    assert checks["delivery_worker"] == {"name": "delivery_worker", "ok": True, "detail": "1 live"}
    (worker,) = r["workers"]
    assert worker["hostname"] == "test-worker"
    assert worker["queues"] == ["agents", "heartbeat", "webhooks"]
    assert (worker["beatAgeSeconds"], worker["live"], worker["backlogReenqueued"]) == (
        0.0,
        True,
        True,
    )
    assert r["instance"]
    push = by_slug(data)["shop-bot"]["capabilities"]["pushNotifications"]
    assert push == {"on": True, "reason": "a delivery worker is live"}
    # No event hub runs in this process: the instance has never been ready.
    assert checks["event_hub"]["ok"] is False
    assert by_slug(data)["shop-bot"]["card"] == "503: never ready"


def test_dashboard_readiness_and_readyz_are_one_computation(db, client):
    """/readyz, the dashboard's readiness block and the answering instance's own row agree,
    although its row was written before a worker registered (the row of that moment said
    "no worker consumes `agents`")."""
    readiness_reset()
    readiness.web_instance_beat(
        name=readiness.instance_name(),
        started_at=timezone.now(),
        state=readiness.instance_readiness(),
    )
    stored = WebInstance.objects.get(name=readiness.instance_name())
    assert "no worker consumes `agents`" in stored.failing["agents_worker"]
    mark_workers_live()

    data = dashboard.dashboard_data()
    readyz = client.get("/readyz").json()

    block = data["readiness"]
    (row,) = [w for w in block["webInstances"] if w["thisInstance"]]
    assert row["name"] == block["instance"] == readiness.instance_name()
    checks = {c["name"]: c["ok"] for c in block["checks"]}
    assert checks == {name: c["ok"] for name, c in readyz["checks"].items()}
    assert block["ready"] is row["ready"] is (readyz["status"] == "ready")
    failing = {name for name, ok in checks.items() if not ok}
    assert set(row["failing"]) == failing
    assert "agents_worker" not in failing
    assert "broker" in checks


def test_dashboard_json_is_the_index_data_for_a_superuser(scene, client):
    client.force_login(get_user_model().objects.create_superuser("root", password="unused"))

    response = client.get(JSON)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert "no-store" in response["Cache-Control"]
    body = response.json()
    assert body["sections"] == ["alerts", "deliveries", "endpoints", "rebinds"]
    assert by_slug(body)["shop-bot"]["deliveries"]["queueDepth"] == 3

    index = client.get("/admin/")
    assert index.status_code == 200
    readiness_reset()  # the instance's gate is cached per process for a second
    assert index.context["dashboard"] == client.get(JSON).json()
    html = index.content.decode()
    assert "Django administration" not in html
    assert "<title>Operations dashboard | A2A Platform</title>" in html
    assert '<div id="site-name"><a href="/admin/">A2A Platform</a></div>' in html
    shop = Agent.objects.get(slug="shop-bot").pk
    # The figure links to the deliveries it counts.
    assert (
        '<td class="c-queue c-num"><a href="/admin/webhooks/delivery/'
        f'?task__agent__id__exact={shop}&amp;state__in=pending,sending">3</a></td>'
    ) in html
    assert '<td class="c-oldest">300 s</td>' in html
    assert 'id="dashboard-data"' in html
    assert "webhooks/dashboard.js" in html
    assert "2 / 5 (40%)" in html


@pytest.mark.parametrize("user", ["anonymous", "not staff"])
def test_dashboard_json_refuses_who_is_not_staff(scene, client, user):
    if user == "not staff":
        client.force_login(get_user_model().objects.create_user("visitor", password="unused"))

    response = client.get(JSON)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/admin/dashboard.json")


def test_dashboard_without_delivery_permission_shows_no_delivery_figure(scene, client):
    client.force_login(staff("looker"))

    response = client.get(JSON)

    assert response.status_code == 200
    body = response.json()
    assert body["sections"] == []
    assert "deliveries" not in by_slug(body)["shop-bot"]
    assert not {"chart", "totals", "endpoints", "alerts", "rebinds"} & set(body)
    assert "queueDepth" not in response.content.decode()
    html = client.get("/admin/").content.decode()
    assert 'class="c-queue"' not in html
    assert "Delivery figures are not shown" in html
    assert 'id="open-alerts"' not in html


def test_dashboard_sections_follow_view_permissions(scene, client):
    client.force_login(staff("deliveries-only", ("view_delivery",)))
    body = client.get(JSON).json()
    assert body["sections"] == ["deliveries"]
    assert by_slug(body)["shop-bot"]["deliveries"]["dead"] == 2

    client.force_login(staff("operator", ("change_endpoint", "view_alert", "view_rebind")))
    body = client.get(JSON).json()
    assert body["sections"] == ["alerts", "endpoints", "rebinds"]
    assert "deliveries" not in by_slug(body)["shop-bot"]


def test_dashboard_queries_are_bounded_whatever_the_store(scene, time_machine, client):
    client.force_login(get_user_model().objects.create_superuser("root", password="unused"))
    counted = []
    for _ in range(2):
        readiness_reset()
        with CaptureQueriesContext(connection) as queries:
            assert client.get(JSON).status_code == 200
        counted.append(len(queries))
        # Ten more agents, each with deliveries, attempts, a failing endpoint, an alert and
        # an open rebind: the query count stays the same.
        for n in range(10):
            agent = AgentFactory(executor="external")
            config = registered(agent, "x", f"https://e{len(counted)}-{n}.example.org/hook")
            delivery = snapshot_of(config)
            attempt(delivery, NOW - timedelta(minutes=n), 200)
            Alert.objects.create(kind=AlertKind.DEAD_LETTER, message=f"dead {n}")
            Endpoint.objects.filter(pk=config.bindings.get().endpoint_id).update(
                consecutive_failures=1
            )
            rebind = Rebind.objects.create(
                agent=agent,
                policy="drain",
                state=RebindState.DRAINING,
                deadline_seconds=60,
                on_timeout="cutover",
                actor="ops",
            )
            ChannelMove.objects.create(
                rebind=rebind,
                config=config,
                task_id=config.task_id,
                old_binding=config.bindings.get(),
                state=MoveState.MOVED,
            )
    assert counted[0] == counted[1], counted


def test_dashboard_json_max_queries(scene, client, django_assert_max_num_queries):
    client.force_login(get_user_model().objects.create_superuser("root", password="unused"))
    readiness_reset()  # the gate's checks are counted too, not its cache
    # Session and user (2), the gate (5: database, migrations, heartbeats, hosted agents),
    # the web instances, the workers, agents, deliveries, attempts, endpoints (5: counts,
    # rows, and their health: attempts, what they owe, failing since), alerts (2), rebinds
    # and their moves (2).
    with django_assert_max_num_queries(21):
        assert client.get(JSON).status_code == 200
