"""The delivery admin in a real browser (Debian's chromium via Playwright, as test_admin.py).

Issue 4: the admin lists and filters deliveries by agent, task, state and endpoint with the
attempt timeline, and replays one or many (dead-lettered or delivered) with an audit record;
open alerts show on the admin index and in /readyz.

The deliveries are made by the services: registrations write the snapshot deliveries, a
transition writes a status delivery, and the real claim and record functions send them
(the TransportResult of each send is built here: it is all the policy sees of a send).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.deliveries import delivery_claim_head, delivery_record
from tests.e2e.test_admin import PASSWORD, log_in
from tests.e2e.test_admin import page as page  # noqa: F401 (the browser fixture)
from tests.factories import AgentFactory, task_create, user_message
from webhooks.delivery import ssrf
from webhooks.delivery.transport import TransportResult
from webhooks.models import Delivery, DeliveryState
from webhooks.services import push_config_create

DELIVERIES = "/admin/webhooks/delivery/"
HOOKS = "https://hooks.example.org:443"
OTHER = "https://other.example.org:443"
PUBLIC_V4 = "93.184.215.14"


@dataclass(frozen=True)
class Deliveries:
    """Event ids (the list's first column) and primary keys of the four deliveries."""

    a_snapshot: str  # shop-bot, task A, hooks: delivered at once
    a_status: str  # shop-bot, task A, hooks: timeout, 503, 404 -> dead-lettered
    b_snapshot: str  # shop-bot, task B, other: delivered
    c_snapshot: str  # other-bot, task C, hooks: pending (never claimed)
    pks: dict[str, int]  # event id -> pk
    task_a: str


def sent(status: int | None, error: str | None, duration_ms: float) -> TransportResult:
    return TransportResult(
        status=status,
        headers={},
        body_excerpt="" if status is None else f"answer {status}",
        duration_ms=duration_ms,
        error_class=error,
        retry_after=None,
        error_detail="timed out after 5 s" if error == "timeout" else None,
    )


@pytest.fixture
def deliveries(transactional_db, monkeypatch, settings) -> Deliveries:
    """Written before the browser starts (Playwright's sync API runs an event loop on this
    thread, where Django refuses ORM calls)."""
    # Host names under example.org resolve to a public address (the SSRF check at
    # registration); nothing is sent, so nothing else is resolved.
    monkeypatch.setattr(ssrf, "resolve", lambda host, port: [PUBLIC_V4])
    settings.A2A_WEBHOOK_RETRY_SCHEDULE = ["0", "0"]  # two retries, due at once
    get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
    shop = AgentFactory(slug="shop-bot", executor="external")
    other = AgentFactory(slug="other-bot", executor="external")

    def task_with_hook(agent, config_id: str, url: str):
        task = task_create(agent=agent, owner="anonymous", message=user_message("hi"))
        push = push_config_create(task=task, config={"id": config_id, "url": url}).config
        return task, push

    def send(push, result: TransportResult) -> int:
        claim = delivery_claim_head(config_pk=push.pk)
        assert claim is not None
        delivery_record(claim=claim, result=result)
        return claim.delivery_pk

    task_a, push_a = task_with_hook(shop, "a", "https://hooks.example.org/a2a")
    services.task_transition(task_id=task_a.id, to_state=TaskState.WORKING, message="working")
    a_snapshot = send(push_a, sent(204, None, 7.5))
    a_status = send(push_a, sent(None, "timeout", 5000.0))
    assert send(push_a, sent(503, None, 12.5)) == a_status
    assert send(push_a, sent(404, None, 8.25)) == a_status
    _, push_b = task_with_hook(shop, "b", "https://other.example.org/hook")
    b_snapshot = send(push_b, sent(200, None, 3.0))
    _, push_c = task_with_hook(other, "c", "https://hooks.example.org/a2a")

    rows = {d.pk: d for d in Delivery.objects.all()}
    assert rows[a_snapshot].state == DeliveryState.DELIVERED
    assert rows[a_status].state == DeliveryState.DEAD
    assert rows[b_snapshot].state == DeliveryState.DELIVERED
    (c_snapshot,) = (pk for pk, d in rows.items() if d.config_id == push_c.pk)
    assert rows[c_snapshot].state == DeliveryState.PENDING
    assert len(rows) == 4
    event = {pk: str(d.event_id) for pk, d in rows.items()}
    return Deliveries(
        a_snapshot=event[a_snapshot],
        a_status=event[a_status],
        b_snapshot=event[b_snapshot],
        c_snapshot=event[c_snapshot],
        pks={event_id: pk for pk, event_id in event.items()},
        task_a=str(task_a.id),
    )


def orm(read: Callable[[], Any]) -> Any:
    """Run an ORM read on a thread of its own (this one runs Playwright's event loop)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = read()
        except BaseException as exc:  # re-raised on the test's thread
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def listed(page) -> set[str]:
    page.wait_for_selector("#changelist")
    return set(page.locator("#result_list tbody th.field-event_id").all_inner_texts())


def choose_filter(page, title: str, name: str) -> None:
    link = page.locator(f'#changelist-filter details[data-filter-title="{title}"]').get_by_role(
        "link", name=name, exact=True
    )
    query = link.get_attribute("href")  # "?…": the filters chosen so far and this one
    link.click()
    page.wait_for_url(lambda url: url.endswith(query))


def test_admin_delivery_list_filters_by_agent_task_state_and_endpoint(deliveries, page):
    d = deliveries
    log_in(page)
    page.locator("#content-main").get_by_role("link", name="Deliveries").click()
    page.wait_for_url(re.compile(re.escape(DELIVERIES) + "$"))
    everything = {d.a_snapshot, d.a_status, d.b_snapshot, d.c_snapshot}
    assert listed(page) == everything
    row = page.locator("#result_list tbody tr", has_text=d.a_status)
    assert "shop-bot" in row.inner_text()
    assert "dead-lettered" in row.inner_text()
    assert "https://hooks.example.org/a2a" in row.inner_text()  # the receiver URL column

    choose_filter(page, "agent", "other-bot")
    assert listed(page) == {d.c_snapshot}
    choose_filter(page, "agent", "shop-bot")
    assert listed(page) == {d.a_snapshot, d.a_status, d.b_snapshot}
    choose_filter(page, "state", "delivered")  # filters combine
    assert listed(page) == {d.a_snapshot, d.b_snapshot}

    page.goto(DELIVERIES)
    for state, expected in (
        ("dead-lettered", {d.a_status}),
        ("pending", {d.c_snapshot}),
        ("delivered", {d.a_snapshot, d.b_snapshot}),
    ):
        choose_filter(page, "state", state)
        assert listed(page) == expected, state

    page.goto(DELIVERIES)
    choose_filter(page, "endpoint", OTHER)
    assert listed(page) == {d.b_snapshot}
    choose_filter(page, "endpoint", HOOKS)
    assert listed(page) == {d.a_snapshot, d.a_status, d.c_snapshot}

    # A row's task narrows the list to that task's deliveries; the side bar names it.
    page.goto(DELIVERIES)
    row = page.locator("#result_list tbody tr", has_text=d.a_snapshot)
    row.locator("td.field-task_link a").click()
    page.wait_for_url(re.compile(rf"[?&]task={d.task_a}"))
    assert listed(page) == {d.a_snapshot, d.a_status}
    task_filter = page.locator('#changelist-filter details[data-filter-title="task"]')
    assert task_filter.locator("li.selected").inner_text() == d.task_a
    # A malformed task id lists nothing, and is no server error.
    page.goto(f"{DELIVERIES}?task=not-a-uuid")
    assert "Server Error" not in page.content()
    assert listed(page) == set()


def test_admin_delivery_page_shows_the_attempt_timeline(deliveries, page):
    d = deliveries
    log_in(page)
    page.goto(f"{DELIVERIES}?q={d.a_status}")
    page.locator("#result_list tbody th.field-event_id a").click()
    page.wait_for_url(re.compile(rf"{DELIVERIES}{d.pks[d.a_status]}/change/"))

    timeline = page.locator("#attempts_log-group")
    assert timeline.locator("h2").inner_text().lower() == "attempt timeline"
    rows = timeline.locator("tbody tr.has_original")
    assert rows.count() == 3

    def column(name: str) -> list[str]:
        return [rows.nth(i).locator(f"td.field-{name}").inner_text() for i in range(3)]

    # Newest first; each try out of the run's three (the schedule's two waits and the first).
    assert column("attempt_of") == ["3 of 3", "2 of 3", "1 of 3"]
    assert column("result") == ["404", "503", "timeout"]
    assert column("failure") == [
        "HTTP 404 Not Found from the receiver",
        "HTTP 503 Service Unavailable from the receiver",
        "timed out after 5 s",
    ]
    assert column("duration_ms") == ["8.25", "12.5", "5000.0"]
    # Read-only: a delivery changes through the services (and the replay action) only.
    assert page.locator("input[name=_save]").count() == 0
    assert page.locator("#attempts_log-group input:not([type=hidden])").count() == 0


def run_replay(page) -> str:
    page.select_option("select[name=action]", "replay")
    page.locator("#changelist-form button[name=index]").click()
    page.wait_for_selector("ul.messagelist")
    return page.locator("ul.messagelist").inner_text()


def test_admin_replays_one_dead_letter_then_many_delivered_with_audit(deliveries, page):
    d = deliveries
    log_in(page)

    page.goto(DELIVERIES)
    choose_filter(page, "state", "dead-lettered")
    assert listed(page) == {d.a_status}
    page.check(f"input[name=_selected_action][value='{d.pks[d.a_status]}']")
    assert "1 of 1 selected deliveries re-opened" in run_replay(page)

    page.goto(f"{DELIVERIES}?state__exact=pending")
    assert listed(page) == {d.a_status, d.c_snapshot}

    page.goto(f"{DELIVERIES}?state__exact=delivered")
    assert listed(page) == {d.a_snapshot, d.b_snapshot}
    page.check("#action-toggle")  # every row of the page
    assert "2 of 2 selected deliveries re-opened" in run_replay(page)

    page.goto(f"{DELIVERIES}?state__exact=pending")
    assert listed(page) == {d.a_snapshot, d.a_status, d.b_snapshot, d.c_snapshot}

    page.goto("/admin/agents/operatoraction/")
    audit_rows = page.locator("#result_list tbody tr", has_text="replay deliveries")
    assert audit_rows.count() == 2
    assert d.a_status in page.locator("#result_list").inner_text()

    def read():
        states = dict(Delivery.objects.values_list("pk", "state"))
        audit = list(
            OperatorAction.objects.filter(action="replay_deliveries")
            .order_by("pk")
            .values_list("actor", "target")
        )
        return states, audit

    states, audit = orm(read)
    assert set(states.values()) == {DeliveryState.PENDING}
    assert audit == [
        ("admin", {"deliveries": [d.a_status]}),
        ("admin", {"deliveries": [d.a_snapshot, d.b_snapshot]}),  # in delivery order
    ]


def test_admin_index_and_readyz_show_the_open_alert(deliveries, page):
    d = deliveries
    log_in(page)

    alerts = page.locator("#open-alerts")
    assert alerts.locator("h2").inner_text().lower() == "open alerts (1)"
    text = alerts.inner_text()
    assert "delivery dead-lettered" in text
    assert d.a_status in text
    alerts.get_by_role("link", name="All open alerts").click()
    page.wait_for_url(re.compile(r"/admin/webhooks/alert/\?resolved_at__isnull=True"))
    assert d.a_status in page.locator("#result_list").inner_text()

    response = page.request.get("/readyz")
    # No worker runs here, so the instance is not ready; open alerts are listed either way.
    assert response.status == 503
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["checks"]["delivery_worker"]["ok"] is False
    assert [(a["kind"], a["endpoint"]) for a in body["alerts"]] == [("dead_letter", HOOKS)]
    assert d.a_status in body["alerts"][0]["message"]
