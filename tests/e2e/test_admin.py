"""The Django admin in a real browser: Debian's chromium driven by Playwright, against the ASGI
app the platform serves (`a2a_platform.asgi.application`: its router, lifespan and Django,
under uvicorn).

Nothing is downloaded here: Playwright's own browser builds are never installed, the system
chromium is launched by path. A missing chromium fails the test (CI installs it in .ci/run);
a skipped browser test would hide a broken admin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from agents.services import api_key_create, api_key_revoke
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "e2e-admin-password"
TIMEOUT_MS = 15_000


@dataclass(frozen=True)
class AdminData:
    agent_pk: int
    agent_slug: str
    done_id: str
    done_events: int
    other_done_id: str
    working_id: str
    submitted_id: str
    key_prefixes: tuple[str, ...]
    secrets: tuple[str, ...]  # key digests and token secrets: never on any admin page
    key_ids: tuple[str, ...]


@pytest.fixture
def admin_data(transactional_db) -> AdminData:
    """Everything is written before the browser starts (Playwright's sync API keeps an event
    loop on this thread, and Django refuses ORM calls from a thread with a running loop)."""
    get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
    agent = AgentFactory(slug="shop-bot", executor="external")
    other = AgentFactory(slug="other-bot", executor="external")

    def new_task(a):
        return task_create(agent=a, owner="anonymous", message=user_message("hi"))

    done = new_task(agent)
    services.task_transition(task_id=done.id, to_state=TaskState.WORKING, message="working")
    services.task_add_artifact(
        task_id=done.id, artifact={"artifactId": "a1", "parts": [{"text": "result"}]}
    )
    services.task_transition(task_id=done.id, to_state=TaskState.COMPLETED)
    other_done = new_task(other)
    services.task_transition(task_id=other_done.id, to_state=TaskState.COMPLETED)
    working = new_task(agent)
    services.task_transition(task_id=working.id, to_state=TaskState.WORKING)
    submitted = new_task(agent)

    client = api_key_create(agent=agent, name="storefront client")
    worker = api_key_create(agent=agent, name="fulfilment worker", kind="worker")
    api_key_revoke(key_id=worker.key.pk, actor="test")
    keys = (client, worker)
    return AdminData(
        agent_pk=agent.pk,
        agent_slug=agent.slug,
        done_id=str(done.id),
        done_events=Task.objects.get(pk=done.id).last_seq,
        other_done_id=str(other_done.id),
        working_id=str(working.id),
        submitted_id=str(submitted.id),
        key_prefixes=tuple(k.key.prefix for k in keys),
        secrets=tuple(k.key.digest for k in keys) + tuple(k.token.split("_", 2)[2] for k in keys),
        key_ids=tuple(str(k.key.pk) for k in keys),
    )


@pytest.fixture
def page(asgi_server):
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} not found: the admin browser test needs Debian's chromium "
            "(apt-get update && apt-get install -y chromium; .ci/run installs it)",
            pytrace=False,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: make install", pytrace=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            page = browser.new_page(base_url=asgi_server.url)
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def log_in(page) -> None:
    page.goto("/admin/")
    assert "/admin/login/" in page.url
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    assert page.url.endswith("/admin/"), page.url
    assert page.locator("#user-tools").inner_text().upper().startswith("WELCOME, ADMIN")


def listed_task_ids(page) -> set[str]:
    return set(page.locator("#result_list tbody th.field-id").all_inner_texts())


def test_admin_serves_its_static_files(admin_data, page):
    static = []
    page.on("response", lambda r: static.append(r) if "/static/" in r.url else None)
    log_in(page)

    loaded = {re.sub(r".*/static/", "", r.url): r.status for r in static}
    assert loaded.get("admin/css/base.css") == 200, loaded
    assert set(loaded.values()) == {200}, loaded
    response = page.request.get("/static/admin/css/base.css")
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/css")
    # The stylesheet applied: the header is the admin's dark blue, not the browser default.
    background = page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent")


def test_admin_task_changelist_filter_search_and_timeline(admin_data, page):
    log_in(page)

    page.locator("#content-main #tasks-task").get_by_role("link", name="Tasks").click()
    page.wait_for_selector("#result_list")
    assert listed_task_ids(page) == {
        admin_data.done_id,
        admin_data.other_done_id,
        admin_data.working_id,
        admin_data.submitted_id,
    }

    page.locator("#changelist-filter").get_by_role("link", name="completed", exact=True).click()
    page.wait_for_url(re.compile(r"state__exact=TASK_STATE_COMPLETED"))
    assert listed_task_ids(page) == {admin_data.done_id, admin_data.other_done_id}

    page.fill("#searchbar", admin_data.done_id)
    page.press("#searchbar", "Enter")
    page.wait_for_url(re.compile(r"[?&]q="))
    assert listed_task_ids(page) == {admin_data.done_id}
    row = page.locator("#result_list tbody tr")
    assert "shop-bot" in row.inner_text()
    assert "completed" in row.inner_text()

    page.fill("#searchbar", "00000000-0000-0000-0000-000000000000")
    page.press("#searchbar", "Enter")
    page.wait_for_load_state()
    assert listed_task_ids(page) == set()
    page.fill("#searchbar", "not a uuid")
    page.press("#searchbar", "Enter")
    page.wait_for_load_state()
    assert page.locator("#result_list").count() == 0  # no match, and no server error
    assert "Server Error" not in page.content()

    page.goto(f"/admin/tasks/task/?q={admin_data.done_id}")
    page.locator("#result_list tbody th.field-id a").click()
    page.wait_for_url(re.compile(rf"/admin/tasks/task/{admin_data.done_id}/change/"))
    timeline = page.locator("#events-group")
    assert timeline.locator("h2").inner_text().lower() == "event timeline"
    rows = timeline.locator("tbody tr.has_original")
    seqs = [rows.nth(i).locator("td.field-seq").inner_text() for i in range(rows.count())]
    assert seqs == [str(n) for n in range(1, admin_data.done_events + 1)]
    assert admin_data.done_events == 4
    kinds = [rows.nth(i).locator("td.field-kind").inner_text() for i in range(rows.count())]
    assert kinds == ["status update", "status update", "artifact update", "status update"]
    # Read-only: the store is changed by the lifecycle services only.
    assert page.locator("input[name=_save]").count() == 0
    assert page.locator("#events-group input:not([type=hidden])").count() == 0


def test_admin_agent_page_lists_keys_without_secrets(admin_data, page):
    log_in(page)

    page.goto(f"/admin/agents/agent/{admin_data.agent_pk}/change/")
    keys = page.locator("#api_keys-group")
    keys.wait_for()
    text = keys.inner_text()
    assert "storefront client" in text
    assert "fulfilment worker" in text
    for prefix in admin_data.key_prefixes:
        assert prefix in text
    html = page.content()
    assert "digest" not in html.lower()
    for secret in admin_data.secrets:
        assert secret not in html

    page.goto("/admin/agents/apikey/")
    page.wait_for_selector("#result_list")
    pages = [page.content()]
    for key_id in admin_data.key_ids:
        page.goto(f"/admin/agents/apikey/{key_id}/change/")
        page.wait_for_selector("#content")
        assert "Server Error" not in page.content()
        pages.append(page.content())
    for html in pages:
        assert "digest" not in html.lower()
        for secret in admin_data.secrets:
            assert secret not in html
