"""The operators' dashboard (the admin index) in a real browser (Debian's chromium via
Playwright, as test_admin.py): the figures it shows are the store's, and it refreshes itself
from /admin/dashboard.json without a reload.

The store is test_admin_deliveries.py's: shop-bot with a delivered snapshot, a dead letter
after three failed attempts and a second delivered snapshot; other-bot with one pending
delivery; one open dead-letter alert. A live worker's heartbeat is written as well.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from agents.models import Agent
from tests.e2e.test_admin import log_in
from tests.e2e.test_admin import page as page  # noqa: F401 (the browser fixture)
from tests.e2e.test_admin_deliveries import Deliveries, orm
from tests.e2e.test_admin_deliveries import deliveries as deliveries  # noqa: F401 (fixture)
from tests.factories import task_create, user_message
from tests.readiness_helpers import mark_workers_live
from webhooks.models import (
    OPEN_DELIVERY_STATES,
    Alert,
    ChannelMove,
    DeliveryAttempt,
    DeliveryState,
    MoveState,
    PushConfig,
    Rebind,
    RebindState,
)
from webhooks.models import Delivery as DeliveryRow
from webhooks.services import push_config_create

POLL_WAIT_MS = 15_000  # three polls


@pytest.fixture
def store(deliveries) -> Deliveries:  # noqa: F811 (pytest passes the imported fixture)
    """Plus a live worker's heartbeat and an open rebind of shop-bot's two configs: one moved,
    one notice pending (50%)."""
    mark_workers_live("dashboard-worker")
    rebind = Rebind.objects.create(
        agent=Agent.objects.get(slug="shop-bot"),
        move_from="https://hooks.example.org/",
        move_to="https://new.example.org/",
        policy="drain",
        state=RebindState.DRAINING,
        deadline_seconds=3600,
        deadline=timezone.now() + timedelta(hours=1),
        on_timeout="cutover",
        actor="ops",
        moves_planned=True,
    )
    configs = PushConfig.objects.filter(task__agent__slug="shop-bot").order_by("config_id")
    for config, state in zip(configs, [MoveState.MOVED, MoveState.NOTICE_PENDING], strict=True):
        ChannelMove.objects.create(
            rebind=rebind,
            config=config,
            task_id=config.task_id,
            old_binding=config.bindings.get(),
            state=state,
        )
    return deliveries


def figures(slug: str) -> dict:
    """What the store says of one agent, read independently of webhooks/console/dashboard.py."""
    rows = DeliveryRow.objects.filter(task__agent__slug=slug)
    open_rows = rows.filter(state__in=OPEN_DELIVERY_STATES)
    oldest = open_rows.order_by("created_at").values_list("created_at", flat=True).first()
    hour = DeliveryAttempt.objects.filter(
        delivery__task__agent__slug=slug,
        started_at__gte=timezone.now() - timedelta(minutes=59),
        duration_ms__isnull=False,
    )
    delivered = hour.filter(status__gte=200, status__lt=300).count()
    return {
        "queue": open_rows.count(),
        "dead": rows.filter(state=DeliveryState.DEAD).count(),
        "held": rows.filter(state=DeliveryState.HELD).count(),
        "delivered": delivered,
        "failed": hour.count() - delivered,
        "oldest_age": (timezone.now() - oldest).total_seconds() if oldest else None,
    }


def shown(page, slug: str) -> dict:
    row = page.locator(f'#dash-agent-rows tr[data-agent="{slug}"]')

    def cell(name: str) -> str:
        return row.locator(f".c-{name}").inner_text().strip()

    return {name: cell(name) for name in ("queue", "dead", "held", "delivered", "failed", "oldest")}


def chart_totals(page, slug: str) -> tuple[int, int]:
    """The chart's bars, summed from each minute's tooltip ("12:04: 2 delivered, 3 failed")."""
    titles = page.locator(f'#dash-agent-rows tr[data-agent="{slug}"] svg g title')
    delivered = failed = 0
    for text in titles.all_text_contents():
        d, f = re.search(r"(\d+) delivered, (\d+) failed", text).groups()
        delivered, failed = delivered + int(d), failed + int(f)
    assert titles.count() == 60
    return delivered, failed


def test_dashboard_shows_the_store_and_refreshes_itself(store, page, tmp_path: Path):
    log_in(page)

    assert page.locator("#site-name").inner_text() == "A2A Platform"
    assert page.title() == "Operations dashboard | A2A Platform"
    assert "Django administration" not in page.content()
    page.wait_for_selector("#dashboard svg.dash-chart g", state="attached")  # drawn

    for slug in ("shop-bot", "other-bot"):
        expected = orm(lambda slug=slug: figures(slug))
        on_page = shown(page, slug)
        for name in ("queue", "dead", "held", "delivered", "failed"):
            assert on_page[name] == str(expected[name]), (slug, name, on_page)
        if expected["oldest_age"] is None:
            assert on_page["oldest"] == "–"
        else:
            age = int(on_page["oldest"].removesuffix(" s"))
            assert abs(age - expected["oldest_age"]) <= 10, (on_page, expected)
        assert chart_totals(page, slug) == (expected["delivered"], expected["failed"])
    assert shown(page, "shop-bot")["dead"] == "1"
    assert shown(page, "other-bot")["queue"] == "1"

    checks = page.locator("#dash-checks")
    assert checks.locator('tr[data-check="database"] .c-state').inner_text() == "ok"
    assert "1 live" in checks.locator('tr[data-check="delivery_worker"]').inner_text()
    worker = page.locator('#dash-workers tr[data-worker="dashboard-worker"]')
    assert worker.locator(".c-live").inner_text() == "live"
    assert re.fullmatch(r"\d+ s", worker.locator(".c-age").inner_text())
    push = page.locator('#dash-agent-rows tr[data-agent="shop-bot"] .c-push').inner_text()
    assert push == "on: a delivery worker is live"

    open_alerts = orm(lambda: Alert.objects.filter(resolved_at__isnull=True).count())
    assert page.locator("#dash-alerts-open").inner_text() == str(open_alerts) == "1"
    assert store.a_status in page.locator("#open-alerts").inner_text()
    rebind = page.locator("#dash-rebind-rows tr[data-rebind]")
    assert rebind.count() == 1
    assert "shop-bot" in rebind.inner_text()
    assert rebind.locator(".c-progress-text").inner_text() == "1 / 2 (50%)"
    assert rebind.locator("progress").get_attribute("value") == "50"
    assert rebind.locator(".c-on-old").inner_text() == "1"

    # A delivery written after the page loaded shows after a poll, without a reload; so does
    # the rebind's last move.
    page.evaluate("window.__sameDocument = true")

    def write() -> None:
        task = task_create(
            agent=Agent.objects.get(slug="other-bot"), owner="anonymous", message=user_message()
        )
        push_config_create(task=task, config={"id": "late", "url": "https://late.example.org/"})
        ChannelMove.objects.filter(state=MoveState.NOTICE_PENDING).update(state=MoveState.MOVED)

    orm(write)
    assert orm(lambda: figures("other-bot"))["queue"] == 2
    page.wait_for_function(
        """() => document.querySelector('#dash-agent-rows tr[data-agent="other-bot"] .c-queue')
                   .textContent === "2" """,
        timeout=POLL_WAIT_MS,
    )
    rebind = page.locator("#dash-rebind-rows tr[data-rebind]")
    assert rebind.locator(".c-progress-text").inner_text() == "2 / 2 (100%)"
    assert rebind.locator("progress").get_attribute("value") == "100"
    assert rebind.locator(".c-on-old").inner_text() == "0"
    assert page.evaluate("window.__sameDocument") is True
    # Not exact: the page polls on a timer, and the change above may take one poll or more.
    assert int(page.locator("#dashboard").get_attribute("data-polls")) >= 1
    assert page.locator("#dash-poll-status").inner_text() == ""
    assert shown(page, "shop-bot")["dead"] == "1"

    shots = [tmp_path / "dashboard.png", Path(settings.BASE_DIR) / "var/screenshots/dashboard.png"]
    shots[1].parent.mkdir(parents=True, exist_ok=True)
    for shot in shots:
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000

    # A worker's row links to the workers page, which says what the row says.
    page.locator('#dash-workers tr[data-worker="dashboard-worker"] a').click()
    page.wait_for_selector("#content-main")
    assert "/admin/agents/workerheartbeat/" in page.url
    worker_page = page.locator("#content-main").inner_text()
    assert "dashboard-worker" in worker_page
    assert "live" in page.locator(".field-live").inner_text()
