"""The console's forms as a product at a laptop's width (Debian's chromium via Playwright, as
test_admin.py), issue 47: the rebind wizard shows only the chosen operations' fields, with
the agent preselected from the agent's page, URL inputs wide enough to read a URL and every
option explained; the agent's page grouped by purpose; a scheduled rebind says when it
starts, on the dashboard and in the rebind list. Screenshots under var/test-artifacts/e2e."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from tests.e2e.test_admin import PASSWORD, log_in, page  # noqa: F401 (the page fixture)
from tests.e2e.test_console_product import LAPTOP, ONE_FORMAT
from tests.factories import AgentFactory
from tests.protocol_push import live_open_task
from webhooks.delivery import ssrf
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_start

V1 = "https://client.example.org/hooks/v1/"
V2 = "https://client.example.org/hooks/v2/"


@pytest.fixture
def forms_data(transactional_db, monkeypatch, asgi_server):
    """Two agents, one in-flight task with a push config (SendMessage through the server),
    and a rebind of the other agent scheduled in an hour."""
    monkeypatch.setattr(ssrf, "resolve", lambda host, port: ["93.184.216.34"])
    get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
    shop = AgentFactory(slug="shop-bot", executor="external")
    later = AgentFactory(slug="later-bot", executor="external")
    live_open_task(asgi_server.url, shop, push={"id": "cfg", "url": f"{V1}task"})
    live_open_task(asgi_server.url, later, push={"id": "cfg", "url": f"{V1}later"})
    at = timezone.now() + timedelta(hours=1)
    scheduled = rebind_start(
        RebindRequest(agent=later, move_from=V1, move_to=V2, at=at), actor="ops"
    )
    assert scheduled.state == "scheduled"
    return shop.pk


def visible_fields(on) -> set[str]:
    return set(
        on.locator("#rebind-form [name]:visible").evaluate_all("els => els.map(e => e.name)")
    )


def test_the_rebind_wizard_shows_the_chosen_operations_fields(forms_data, page, artifacts):  # noqa: F811
    page.set_viewport_size(LAPTOP)
    log_in(page)
    # From the agent's page: grouped by purpose, its rotation link preselects it.
    page.goto(f"/admin/agents/agent/{forms_data}/change/")
    headings = page.locator("fieldset.module h2").all_inner_texts()
    assert headings[:6] == [
        "Identity",
        "Switches",
        "Authentication",
        "Card",
        "Push channels and rebinds",
        "Now",
    ]
    page.screenshot(path=str(artifacts / "agent.png"), full_page=True)
    page.click("#rotate-key")
    page.wait_for_selector("#rebind-form")
    assert page.locator("#id_agent").input_value() == "shop-bot"
    assert page.locator("input[name=operations][value=rotate_key]").is_checked()

    # Rotation alone: no URL or config field is shown.
    shown = visible_fields(page)
    assert not shown & {"move_from", "move_to", "new_url", "task_id", "new_token"}
    assert {"agent", "operations", "policy", "deadline", "at", "reason"} <= shown
    page.screenshot(path=str(artifacts / "wizard-rotate.png"), full_page=True)

    page.check("input[name=operations][value=move_prefix]")
    shown = visible_fields(page)
    assert {"move_from", "move_to", "move_origin"} <= shown
    assert "new_url" not in shown
    # Wide enough to read a URL, and every option explained.
    width = page.locator("#id_move_from").bounding_box()["width"]
    assert width >= 500, width
    for row in page.locator("#rebind-form .form-row:visible").all():
        assert row.locator(".help").inner_text().strip(), row.inner_html()[:200]
    page.screenshot(path=str(artifacts / "wizard-move.png"), full_page=True)

    page.uncheck("input[name=operations][value=move_prefix]")
    page.check("input[name=operations][value=config]")
    shown = visible_fields(page)
    assert {"task_id", "config_id", "new_url", "new_token", "new_credentials"} <= shown
    assert "move_from" not in shown

    # Without the script every section shows (the form works the same).
    base = page.url.split("/admin/")[0]
    no_js = page.context.browser.new_context(
        java_script_enabled=False, storage_state=page.context.storage_state(), base_url=base
    )
    try:
        plain = no_js.new_page()
        plain.goto("/admin/webhooks/rebind/start/")
        assert {"move_from", "new_url", "task_id", "policy"} <= visible_fields(plain)
    finally:
        no_js.close()


def test_a_scheduled_rebind_says_when_it_starts(forms_data, page, artifacts):  # noqa: F811
    page.set_viewport_size(LAPTOP)
    log_in(page)
    row = page.locator("#dash-rebind-rows tr[data-rebind]", has_text="later-bot")
    assert row.locator("td").nth(2).inner_text() == "scheduled"
    deadline = row.locator(".c-deadline").inner_text()
    assert deadline.startswith("starts ")
    assert ONE_FORMAT.fullmatch(deadline.removeprefix("starts "))
    assert deadline.endswith("in 59 min")
    page.screenshot(path=str(artifacts / "dashboard-scheduled.png"), full_page=True)
    page.goto("/admin/webhooks/rebind/")
    cell = page.locator("#result_list tbody tr", has_text="later-bot").locator(
        "td.field-scheduled_for"
    )
    assert ONE_FORMAT.fullmatch(cell.inner_text())
    page.screenshot(path=str(artifacts / "rebind-list.png"), full_page=True)
