"""Rebinds run from the console in a real browser while real processes deliver (issue 16).

Debian's chromium through Playwright (as test_admin.py) drives the admin of the live server;
a real Celery worker (threads pool) delivers from the outbox to a real receiver process
(tests.webhook_receiver) and beat fires the rebind monitor and the clocked start, as in
tests/integration/webhooks/test_rebind_processes.py. Three tasks are in flight with push
configs under /hooks/v1/.

- A drain through the wizard: the receiver first refuses the notices (503), so the in-flight
  list (the moves still on the old version) shows all three tasks; then it accepts them and
  the list is watched until it is empty while the worker's retries deliver the notices, beat
  completes the rebind, and the tasks' next events go to /hooks/v2/.
- With the receiver answering 503 (the notices cannot be delivered, so the tasks stay on the
  old channel): a rebind scheduled through the wizard is started by beat at its time, then
  aborted from the list; a second one is cut over from the list, orphaning the tasks.

A full-page screenshot of each page goes to the `artifacts` directory (printed at the end).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model

from tasks import services
from tasks.states import TaskState
from tests.e2e.test_admin import PASSWORD, log_in
from tests.e2e.test_admin import page as page  # noqa: F401 (the browser fixture)
from tests.e2e.test_admin_deliveries import orm
from tests.factories import AgentFactory
from tests.processes import wait_until
from tests.protocol_push import live_open_task
from tests.readiness_helpers import wait_workers_live
from tests.webhook_checks import start_beat, start_worker
from webhooks.models import ChannelMove, Delivery, DeliveryState, MoveState, Rebind

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_receivers")]

REBINDS = "/admin/webhooks/rebind/"


def scene(web, procs, receivers, *, receiver_status: int, retry_schedule: str):
    """Superuser, agent, receiver, worker and beat; three WORKING tasks, opened through the
    live server `web` (SendMessage with an inline push config, as a client opens them), whose
    first deliveries went out. Then the receiver answers `receiver_status`."""
    get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
    agent = AgentFactory(slug="shop-bot", executor="external", card_max_age=1)
    receiver = receivers.start(hang=0.8)  # slow enough to see tasks leave the list
    start_worker(procs, A2A_WEBHOOK_RETRY_SCHEDULE=retry_schedule)
    start_beat(procs)
    wait_workers_live()
    v1 = f"{receiver.origin}/hooks/v1/"
    tasks = []
    for i in range(3):
        task_id = live_open_task(web.url, agent, push={"id": f"cfg-{i}", "url": f"{v1}task-{i}"})
        services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
        tasks.append(task_id)
    wait_until(
        lambda: not Delivery.objects.exclude(state=DeliveryState.DELIVERED).exists(),
        timeout=60,
        message="the first deliveries delivered",
    )
    receiver.behave(status=receiver_status, hang=0.8)
    return receiver, [str(t) for t in tasks], v1, f"{receiver.origin}/hooks/v2/"


@pytest.fixture
def draining(transactional_db, asgi_server, procs, receivers):
    # The notices are refused (503) until the test lets them through; retried every 2 s.
    return scene(
        asgi_server, procs, receivers, receiver_status=503, retry_schedule="2,2,2,2,2,2,2,2,2,2"
    )


@pytest.fixture
def stuck(transactional_db, asgi_server, procs, receivers):
    # Notices are answered 503 and retried only after 10 minutes: they stay pending.
    return scene(asgi_server, procs, receivers, receiver_status=503, retry_schedule="600")


def start_in_wizard(page, v1: str, v2: str, *, at: str = "") -> str:
    page.goto(REBINDS)
    page.get_by_role("link", name="Start a rebind").click()
    page.select_option("#id_agent", "shop-bot")
    page.check("input[name=operations][value=move_prefix]")
    page.fill("#id_move_from", v1)
    page.fill("#id_move_to", v2)
    page.fill("#id_deadline", "1h")
    if at:
        page.fill("#id_at", at)
    page.click("input[name=preview]")
    summary = page.locator("#rebind-summary").inner_text()
    assert "In-flight tasks on the old version: 3" in summary, summary
    page.click("#rebind-confirm")
    page.wait_for_selector("#rebind-console")
    match = re.search(r"/rebind/([0-9a-f-]{36})/change/", page.url)
    assert match, page.url
    return match[1]


def state_on_page(page, rebind_pk: str) -> str:
    """The state the rebind's page (its console) names."""
    page.goto(f"{REBINDS}{rebind_pk}/change/")
    return page.locator("#rebind-state").inner_text().strip()


def wait_for_state(page, rebind_pk: str, state: str, timeout: float = 60) -> None:
    wait_until(
        lambda: state_on_page(page, rebind_pk) == state,
        timeout=timeout,
        interval=1,
        message=f"rebind {rebind_pk} {state} on its page",
    )


def on_old_listed(page, rebind_pk: str) -> list[str]:
    """The in-flight list: the rebind's moves still on the old version (the list's link)."""
    page.goto(REBINDS)
    row = page.locator("#result_list tbody tr", has_text=rebind_pk)
    row.locator("td.field-on_old a").click()
    page.wait_for_selector("#changelist")
    return page.locator("#result_list tbody th.field-task").all_inner_texts()  # the first column


def run_list_action(page, rebind_pk: str, action: str, reason: str = "") -> str:
    page.goto(REBINDS)
    page.locator("#result_list tbody tr", has_text=rebind_pk).locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    if reason:
        page.fill("input[name=reason]", reason)
    page.click("button[name=index]")
    return page.locator("ul.messagelist").inner_text()


def test_a_drain_run_from_the_wizard_while_a_real_worker_delivers(draining, page, artifacts):  # noqa: F811
    receiver, task_ids, v1, v2 = draining
    log_in(page)
    rebind_pk = start_in_wizard(page, v1, v2)
    page.screenshot(path=str(artifacts / "drain-started.png"), full_page=True)

    # The receiver refuses the notices: every task is listed on the old version.
    wait_until(
        lambda: sorted(on_old_listed(page, rebind_pk)) == sorted(task_ids),
        timeout=60,
        interval=0.5,
        message="the three tasks listed on the old version",
    )
    page.screenshot(path=str(artifacts / "drain-in-flight.png"), full_page=True)
    receiver.behave(status=200, hang=0.5)  # the worker's next tries get through
    seen: list[int] = []

    def drained() -> bool:
        listed = on_old_listed(page, rebind_pk)
        seen.append(len(listed))
        assert set(listed) <= set(task_ids)
        return not listed

    wait_until(drained, timeout=60, interval=0.5, message="no task left on the old version")
    assert seen == sorted(seen, reverse=True), seen  # tasks only ever leave the list
    page.screenshot(path=str(artifacts / "drain-list-empty.png"), full_page=True)
    wait_for_state(page, rebind_pk, "completed")  # beat's monitor
    page.screenshot(path=str(artifacts / "drain-completed.png"), full_page=True)

    moves = orm(lambda: sorted(ChannelMove.objects.values_list("state", flat=True)))
    assert moves == [MoveState.MOVED] * 3
    orm(
        lambda: [
            services.task_transition(task_id=t, to_state=TaskState.INPUT_REQUIRED) for t in task_ids
        ]
    )
    records = receiver.wait_for(
        lambda rs: (
            {r.header("x-a2a-task-id") for r in rs if "/hooks/v2/" in r.path} >= set(task_ids)
        ),
        timeout=60,
        message="each task's next event on the new prefix",
    )
    for task_id in task_ids:
        accepted = [r for r in records if r.answer.get("status", 200) == 200]  # not refused
        mine = [r for r in accepted if r.header("x-a2a-task-id") == task_id]
        kinds = [(r.header("x-a2a-event-kind"), r.path.split("/")[2]) for r in mine]
        # The notice went on the old channel, and everything after it on the new one.
        assert kinds == [("snapshot", "v1"), ("status", "v1"), ("notice", "v1"), ("status", "v2")]


def test_a_scheduled_rebind_beat_starts_then_abort_then_cut_over(stuck, page, artifacts):  # noqa: F811
    receiver, task_ids, v1, v2 = stuck
    log_in(page)
    at = (datetime.now(UTC) + timedelta(seconds=5)).isoformat(timespec="seconds")
    first = start_in_wizard(page, v1, v2, at=at)
    assert state_on_page(page, first) == "scheduled"
    page.screenshot(path=str(artifacts / "scheduled.png"), full_page=True)
    wait_for_state(page, first, "draining")  # beat's clocked job started it
    page.screenshot(path=str(artifacts / "scheduled-started.png"), full_page=True)
    # The monitor plans the moves in batches after the start; the notices cannot get through.
    wait_until(
        lambda: sorted(on_old_listed(page, first)) == sorted(task_ids),
        timeout=60,
        interval=0.5,
        message="the three tasks listed on the old version",
    )
    page.screenshot(path=str(artifacts / "stuck-on-old.png"), full_page=True)

    assert run_list_action(page, first, "abort", "wrong window") == f"Rebind {first}: aborted"
    assert state_on_page(page, first) == "aborted"
    page.screenshot(path=str(artifacts / "aborted.png"), full_page=True)

    second = start_in_wizard(page, v1, v2)
    assert state_on_page(page, second) == "draining"
    assert f"Rebind {second}: cut over" in run_list_action(page, second, "cut_over")
    page.screenshot(path=str(artifacts / "cut-over-list.png"), full_page=True)
    assert state_on_page(page, second) == "cut over"
    page.screenshot(path=str(artifacts / "cut-over.png"), full_page=True)

    def read():
        return {
            str(r.pk): (r.state, sorted(r.moves.values_list("state", flat=True)))
            for r in Rebind.objects.all()
        }

    assert orm(read) == {
        first: ("aborted", [MoveState.REVERTED] * 3),
        second: ("cut_over", [MoveState.ORPHANED] * 3),
    }
    assert receiver.running
