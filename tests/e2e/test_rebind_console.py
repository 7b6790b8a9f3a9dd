"""The rebind console in a real browser (Debian's chromium through Playwright, as
tests/e2e/test_admin.py): start a drain through the wizard (form, then the confirmation with
its checks and blast radius, then the rebind's page), then abort it from the list. A
full-page screenshot of each step is saved in the `artifacts` directory (var/test-artifacts/e2e/).

DNS is the edge we do not own: the wizard's SSRF check resolves example.org names to a
public address here (the live server runs in this process)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tasks import services
from tasks.states import TaskState
from tests.e2e.test_admin import PASSWORD, log_in, page  # noqa: F401 (the page fixture)
from tests.e2e.test_admin_deliveries import orm
from tests.factories import AgentFactory
from tests.protocol_push import live_open_task
from webhooks.delivery import ssrf
from webhooks.models import Rebind

V1 = "https://client.example.org/hooks/v1/"
V2 = "https://client.example.org/hooks/v2/"


@pytest.fixture
def console_data(transactional_db, monkeypatch, asgi_server):
    """Two in-flight tasks opened through the server the browser uses (SendMessage with an
    inline push config, as a client opens them: the bindings' issuer is its URL)."""
    monkeypatch.setattr(ssrf, "resolve", lambda host, port: ["93.184.216.34"])
    get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
    agent = AgentFactory(slug="shop-bot", executor="external")
    for i, state in enumerate((TaskState.WORKING, TaskState.INPUT_REQUIRED)):
        push = {"id": f"cfg-{i}", "url": f"{V1}task-{i}"}
        task_id = live_open_task(asgi_server.url, agent, push=push)
        services.task_transition(task_id=task_id, to_state=state)
    return agent


def test_a_drain_started_through_the_wizard_then_aborted(console_data, page, artifacts):  # noqa: F811
    log_in(page)
    page.goto("/admin/webhooks/rebind/")
    page.get_by_role("link", name="Start a rebind").click()
    page.select_option("#id_agent", "shop-bot")
    page.check("input[name=operations][value=move_prefix]")
    page.fill("#id_move_from", V1)
    page.fill("#id_move_to", V2)
    page.fill("#id_deadline", "1h")
    assert page.locator("#content h1").inner_text() == "Start a rebind"
    assert page.locator("#rebind-form .errornote").count() == 0
    page.screenshot(path=str(artifacts / "rebind-start.png"), full_page=True)
    page.click("input[name=preview]")

    summary = page.locator("#rebind-summary").inner_text()
    assert "In-flight tasks on the old version: 2; input-required 1; working 1" in summary
    assert "https://client.example.org:443" in summary
    assert "No open rebind over this scope" in page.locator("#rebind-checks").inner_text()
    assert page.locator("#rebind-tasks tbody tr").count() == 2
    page.screenshot(path=str(artifacts / "rebind-confirm.png"), full_page=True)
    page.click("#rebind-confirm")

    # The rebind's page is its console (docs/rebinds.md, "From the admin"): the state chip
    # and the live list of the tasks still on the old version.
    page.wait_for_selector("#rebind-on-old-rows tr[data-task]")
    assert "/change/" in page.url
    assert page.locator("#rebind-state-chip").inner_text() == "draining"
    moves = page.locator("#rebind-on-old-rows td.c-move").all_inner_texts()
    assert moves == ["notice pending on the old channel"] * 2
    page.screenshot(path=str(artifacts / "rebind-page.png"), full_page=True)

    page.goto("/admin/webhooks/rebind/")
    page.check("#result_list tbody input.action-select")
    page.select_option("select[name=action]", "abort")
    page.fill("input[name=reason]", "wrong prefix")  # an abort says why (the service asks)
    page.click("button[name=index]")
    rebind_pk = orm(lambda: str(Rebind.objects.get(agent=console_data).pk))
    # The admin shows each message with its first letter capitalized.
    assert page.locator("ul.messagelist").inner_text() == f"Rebind {rebind_pk}: aborted"
    # The one row, as the list shows it once aborted: no task left on the old version (both
    # returned to their old channel), none moved, none orphaned.
    listed = page.locator("#result_list tbody tr")
    assert listed.count() == 1
    assert listed.locator("td.field-state").inner_text() == "aborted"
    assert listed.locator("td.field-on_old").inner_text() == "0"
    assert listed.locator("td.field-moved").inner_text() == "0"
    assert listed.locator("td.field-orphaned").inner_text() == "0"
    page.screenshot(path=str(artifacts / "rebind-aborted.png"), full_page=True)
