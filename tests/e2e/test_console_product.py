"""The console as a product at a laptop's width (1366 x 768; Debian's chromium via Playwright,
as test_admin.py), issue 47: one time format, everything links (the dashboard's figures to
their lists, an endpoint's page with its deliveries and its pause, resume and test-send
buttons, a delivery to its endpoint and task, the task to its deliveries), healthy endpoints
listed with their rates, the dashboard agreeing with /readyz, and the operators' own actions
under "Recent operator actions".

The store is test_dashboard.py's (test_admin_deliveries.py's deliveries, made by the
services and the real claim and record; a live worker; an open rebind). Screenshots of each
page are kept under var/test-artifacts/e2e (the `artifacts` fixture).
"""

from __future__ import annotations

import re

import httpx

from agents.models import Agent, OperatorAction
from tests.e2e.test_admin import log_in
from tests.e2e.test_admin import page as page  # noqa: F401 (the browser fixture)
from tests.e2e.test_admin_deliveries import HOOKS, OTHER, Deliveries, orm
from tests.e2e.test_admin_deliveries import deliveries as deliveries  # noqa: F401 (fixture)
from tests.e2e.test_dashboard import store as store  # noqa: F401 (fixture)
from webhooks.models import Delivery, Endpoint

LAPTOP = {"width": 1366, "height": 768}
# "23:44:46 UTC · 2 min ago" (the date in front on another day): no microseconds.
ONE_FORMAT = re.compile(r"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d UTC · (\d+ (s|min|h|d) ago|in \d+ .+)")


def times_on(page) -> list[str]:
    return page.locator("time.a2a-time").all_inner_texts()


def assert_one_format(page) -> None:
    shown = times_on(page)
    assert shown, page.url
    for text in shown:
        assert ONE_FORMAT.fullmatch(text), (page.url, text)
    # No other rendering of a time: Django's "Dec. 6, 2026, 11:44 p.m." nor an ISO string
    # (payloads and headers shown as sent, in <pre> blocks, keep theirs).
    body = page.evaluate(
        """() => { const c = document.querySelector("#content").cloneNode(true);
                   c.querySelectorAll("pre, script").forEach(p => p.remove());
                   return c.textContent; }"""
    )
    assert not re.search(r"\b(a|p)\.m\.", body), page.url
    exact = re.search(r".{80}\d\d:\d\d:\d\d\.\d+.{20}", body, re.DOTALL)
    assert exact is None, (page.url, exact and exact.group())


def test_dashboard_links_times_endpoints_and_readiness(store: Deliveries, page, artifacts):  # noqa: F811
    page.set_viewport_size(LAPTOP)
    log_in(page)
    page.wait_for_selector("#dashboard svg.dash-chart g", state="attached")
    page.screenshot(path=str(artifacts / "dashboard.png"), full_page=True)
    assert_one_format(page)
    assert ONE_FORMAT.fullmatch(page.locator("#dash-generated").inner_text())

    # At a laptop's width no word of the dashboard's tables is broken across lines.
    broken = page.evaluate(
        """() => {
          const out = [], walker = document.createTreeWalker(
            document.querySelector("#dashboard"), NodeFilter.SHOW_TEXT);
          for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            if (!node.parentElement.closest("td, th")) { continue; }
            const re = /\\S+/g; let m;
            while ((m = re.exec(node.data))) {
              const range = document.createRange();
              range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
              const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
              if (lines.size > 1) { out.push(m[0]); }
            }
          }
          return out;
        }"""
    )
    assert broken == [], broken

    # Readiness: the block, this instance's own row and /readyz say the same.
    ready_text = page.locator("#dash-ready").inner_text()
    mine = page.locator("#dash-web-instances tr", has_text="(this one, now)")
    assert mine.count() == 1
    assert mine.locator(".c-ready").inner_text() == ready_text
    base = page.url.split("/admin/")[0]
    readyz = httpx.get(f"{base}/readyz", timeout=10)
    assert (readyz.json()["status"] == "ready") is (ready_text == "ready")
    shown_checks = {
        row.get_attribute("data-check"): row.locator(".c-state").inner_text() == "ok"
        for row in page.locator("#dash-checks tr[data-check]").all()
    }
    readyz_checks = {name: c["ok"] for name, c in readyz.json()["checks"].items()}
    assert {k: v for k, v in shown_checks.items() if k in readyz_checks} == readyz_checks

    # Every endpoint is listed, the healthy one with its rate (one 200 in the last hour).
    healthy = page.locator(f'#dash-endpoint-rows tr[data-endpoint="{OTHER}"]')
    assert healthy.locator(".c-endpoint-state").inner_text() == "ok"
    assert healthy.locator(".c-rate").inner_text() == "100% of 1"
    failing = page.locator(f'#dash-endpoint-rows tr[data-endpoint="{HOOKS}"]')
    assert failing.locator(".c-failures").inner_text() == "3"

    # The figures link to what they count: shop-bot's dead letter.
    shop = page.locator('#dash-agent-rows tr[data-agent="shop-bot"]')
    shop.locator(".c-dead a").click()
    page.wait_for_selector("#result_list")
    ids = page.locator("#result_list tbody th.field-event_id").all_inner_texts()
    assert ids == [store.a_status]
    page.go_back()
    page.locator('#dash-agent-rows tr[data-agent="shop-bot"] .c-agent a').click()
    shop_pk = orm(lambda: Agent.objects.get(slug="shop-bot").pk)
    assert page.url.endswith(f"/admin/agents/agent/{shop_pk}/change/")


def test_endpoint_page_lists_deliveries_and_operates(store: Deliveries, page, artifacts):  # noqa: F811
    page.set_viewport_size(LAPTOP)
    log_in(page)
    page.locator(f'#dash-endpoint-rows tr[data-endpoint="{HOOKS}"] a').click()
    page.wait_for_selector("#endpoint-deliveries")
    page.screenshot(path=str(artifacts / "endpoint.png"), full_page=True)
    assert_one_format(page)
    expected = orm(
        lambda: list(
            Delivery.objects.filter(binding__endpoint__origin=HOOKS)
            .order_by("-id")
            .values_list("event_id", flat=True)
        )
    )
    listed = page.locator("#endpoint-deliveries tbody tr[data-delivery]").evaluate_all(
        "rows => rows.map(r => r.dataset.delivery)"
    )
    assert listed == [str(e) for e in expected]
    assert page.locator("#endpoint-pause").is_visible()
    assert page.locator("#endpoint-send_test").is_visible()
    assert page.locator("#endpoint-resume").count() == 0  # it runs: nothing to resume

    page.click("#endpoint-pause")
    page.wait_for_selector("ul.messagelist")
    assert "Paused 1 endpoint(s)" in page.locator("ul.messagelist").inner_text()
    endpoint = orm(lambda: Endpoint.objects.get(origin=HOOKS))
    assert endpoint.paused_at is not None
    audit = orm(lambda: list(OperatorAction.objects.values_list("action", "target")))
    assert ("pause_endpoint", {"endpoint": endpoint.pk}) in audit
    page.screenshot(path=str(artifacts / "endpoint-paused.png"), full_page=True)
    assert page.locator("#endpoint-resume").is_visible()
    assert page.locator("#endpoint-pause").count() == 0

    # The index's "Recent operator actions" is the platform's audit trail.
    page.goto("/admin/")
    recent = page.locator("#recent-operator-actions li").first
    assert recent.get_attribute("data-action") == "pause endpoint"
    assert f"endpoint {endpoint.pk}" in recent.inner_text()
    assert ONE_FORMAT.fullmatch(recent.locator("time").inner_text())
    page.screenshot(path=str(artifacts / "recent-actions.png"), full_page=True)

    # A GET on a button's URL changes nothing.
    answer = page.request.get(f"/admin/webhooks/endpoint/{endpoint.pk}/do/resume/")
    assert answer.status == 405
    assert orm(lambda: Endpoint.objects.get(pk=endpoint.pk).paused_at) is not None


def test_a_delivery_links_to_its_endpoint_task_and_back(store: Deliveries, page, artifacts):  # noqa: F811
    page.set_viewport_size(LAPTOP)
    log_in(page)
    page.goto(f"/admin/webhooks/delivery/{store.pks[store.a_status]}/change/")
    page.screenshot(path=str(artifacts / "delivery.png"), full_page=True)
    assert_one_format(page)
    endpoint = page.locator(".field-endpoint_link a")
    assert endpoint.inner_text() == HOOKS
    version = page.locator(".field-channel_version a")
    assert version.inner_text() == "a.v1"
    assert "/admin/webhooks/pushconfig/" in version.get_attribute("href")
    page.locator(".field-task a").click()
    page.wait_for_selector("#task-deliveries")
    assert page.url.endswith(f"/admin/tasks/task/{store.task_a}/change/")
    assert_one_format(page)
    page.screenshot(path=str(artifacts / "task.png"), full_page=True)
    count = orm(lambda: Delivery.objects.filter(task_id=store.task_a).count())
    assert page.locator("#task-deliveries").inner_text() == f"{count} deliveries of this task"
    page.click("#task-deliveries")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == count

    page.goto("/admin/agents/agent/")
    assert_one_format(page)


def page_text(page) -> str:
    """What an operator reads on the page: payloads, headers and JSON as sent (<pre>), form
    inputs and scripts left out."""
    return page.evaluate(
        """() => { const c = document.querySelector("#content").cloneNode(true);
                   c.querySelectorAll("pre, script, textarea, select").forEach(p => p.remove());
                   return c.textContent; }"""
    )


def test_operator_pages_read_in_words(store: Deliveries, page, artifacts):  # noqa: F811
    """Every console page in words: no internal name (`cut_over`, `plan_cursor`,
    `pause_endpoint`, `agents_worker`) and no time in another format."""
    page.set_viewport_size(LAPTOP)
    log_in(page)
    page.goto(f"/admin/webhooks/endpoint/{orm(lambda: Endpoint.objects.get(origin=HOOKS).pk)}/")
    page.click("#endpoint-pause")  # an operator action for the audit pages
    lists = [
        "/admin/",
        "/admin/webhooks/delivery/",
        "/admin/webhooks/endpoint/",
        "/admin/webhooks/rebind/",
        "/admin/webhooks/channelmove/",
        "/admin/webhooks/pushconfig/",
        "/admin/webhooks/alert/",
        "/admin/agents/operatoraction/",
        "/admin/tasks/task/",
        "/admin/agents/agent/",
    ]
    for url in lists:
        page.goto(url)
        pages = [url]
        first = page.locator("#result_list tbody tr th a").first
        if url != "/admin/" and first.count():
            pages.append(first.get_attribute("href"))
        for shown in pages:
            page.goto(shown)
            page.wait_for_selector("#content")
            text = page_text(page)
            internal = re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", text)
            assert not internal, (shown, sorted(set(internal)))
            other_time = re.findall(r"\d{4}-\d\d-\d\dT\d\d:\d\d|\d\d:\d\d:\d\d\.\d+", text)
            assert not other_time, (shown, other_time)
            name = re.sub(r"[^a-z0-9]+", "-", shown.strip("/")) or "index"
            page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)
