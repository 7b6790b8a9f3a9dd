"""The rebind's page in a real browser (issue 16; Debian's chromium through Playwright against
the ASGI app, as test_rebind_console.py): state chips, progress and the deadline countdown as
the store has them; the live list of the tasks still on the old version, refreshed by
polling (a second browser watching the page sees a row leave without a reload); each action
through its confirmation page (move selected now, let selected finish on old, extend the
deadline, cut over, abort another rebind), each audited; an ended rebind never looks like a
success nor counts down; a notice the client's receiver refused (400) shows as stuck with the
receiver's answer, on the rebind page and on the task's page, and is replayed from the row
(issue 43); and a "viewer" sees the page without a button, its forged POST refused (403). A
full-page screenshot of each step goes to the `artifacts` directory (var/test-artifacts/e2e/).

Tasks and configs are made through the protocol (tests/protocol_push.py). No worker runs: the
notices stay pending, so the tasks stay on the old version until an operator decides; the
stuck drain's deliveries are sent by the test, to a receiver in this process. DNS is the edge
we do not own (the rebind's SSRF check resolves example.org names to a public address; the
server runs in this process)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.e2e.test_admin import PASSWORD, TIMEOUT_MS, log_in
from tests.e2e.test_admin import page as page  # noqa: F401 (the browser fixture)
from tests.e2e.test_admin_deliveries import orm
from tests.factories import AgentFactory
from tests.integration.webhooks.test_rebind_page import REFUSAL, Receiver, deliver_due
from tests.protocol_push import open_task
from webhooks.delivery import ssrf
from webhooks.models import ChannelMove, Delivery, MoveState, Rebind
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_advance, rebind_start

V1 = "https://hooks.example.org/v1/"
V2 = "https://hooks.example.org/v2/"
REBINDS = "/admin/webhooks/rebind/"


@dataclass(frozen=True)
class Scene:
    rebind: str  # shop-bot's drain: three tasks on the old version
    tasks: list[str]
    other: str  # other-bot's drain: one task, to abort
    scheduled: str  # later-bot's, to start in an hour: no deadline yet


def in_flight(agent, n: int, prefix: str = V1) -> list[str]:
    """n WORKING tasks opened through the protocol, each with one push config under `prefix`."""
    ids = []
    for i in range(n):
        task_id = open_task(agent, push={"id": f"cfg-{i}", "url": f"{prefix}t{i}"})
        services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
        ids.append(task_id)
    return ids


@pytest.fixture
def scene(transactional_db, monkeypatch) -> Scene:
    """Written before the browser starts (Playwright's loop runs on the test's thread)."""
    monkeypatch.setattr(ssrf, "resolve", lambda host, port: ["93.184.215.14"])
    get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
    viewer = get_user_model().objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.groups.add(Group.objects.get(name="viewer"))
    shop, other = AgentFactory(slug="shop-bot"), AgentFactory(slug="other-bot")
    later = AgentFactory(slug="later-bot")
    tasks = in_flight(shop, 3)
    in_flight(other, 1)
    in_flight(later, 1)
    at = timezone.now() + timedelta(hours=1)
    scheduled = rebind_start(
        RebindRequest(agent=later, move_from=V1, move_to=V2, at=at), actor="ops"
    )
    assert scheduled.state == "scheduled"

    def drain(agent) -> str:
        req = RebindRequest(agent=agent, move_from=V1, move_to=V2, deadline_seconds=3600)
        rebind = rebind_start(req, actor="ops")
        assert rebind.state == "draining", rebind.reason
        return str(rebind.pk)

    return Scene(rebind=drain(shop), tasks=tasks, other=drain(other), scheduled=str(scheduled.pk))


def rows(page) -> list[str]:
    return page.locator("#rebind-on-old-rows tr[data-task]").evaluate_all(
        "rs => rs.map(r => r.dataset.task)"
    )


def row(page, task_id: str):
    return page.locator(f"#rebind-on-old-rows tr[data-task='{task_id}']")


def confirm(page, artifacts, name: str) -> str:
    """On an action's confirmation page: its summary; then confirmed, back on the page."""
    page.wait_for_selector("#action-confirmation")
    summary = page.locator("#action-summary").inner_text()
    page.screenshot(path=str(artifacts / f"{name}-confirm.png"), full_page=True)
    page.click("#action-confirm")
    page.wait_for_selector("#rebind-console")
    return summary


def message(page) -> str:
    return page.locator("ul.messagelist").inner_text()


def test_the_rebind_page_shows_the_store_and_runs_each_decision(scene, page, artifacts):  # noqa: F811
    s = scene
    log_in(page)
    page.goto(f"{REBINDS}{s.rebind}/change/")
    page.wait_for_selector("#rebind-on-old-rows tr[data-task]")
    rebind = orm(lambda: Rebind.objects.get(pk=s.rebind))

    # The chips, the progress and the countdown as the store has them.
    assert page.locator("#rebind-state-chip").inner_text() == "draining"
    assert page.locator("#rebind-policy-chip").inner_text() == f"policy: {rebind.policy}"
    assert page.locator("#rebind-scope-chip").inner_text() == f"{V1} → {V2}"
    assert page.locator("#rebind-progress-text").inner_text() == "3 of 3 left on the old version"
    assert page.locator("#rebind-progress-bar").evaluate("p => p.value") == 0
    countdown = page.locator("#rebind-countdown")
    assert re.fullmatch(r"in 59 min \d+ s", countdown.inner_text()), countdown.inner_text()
    seconds_left = (rebind.deadline - timezone.now()).total_seconds()
    assert abs(int(countdown.get_attribute("data-seconds-left")) - seconds_left) < 10

    # The live list: every task on the old version with its notice and last old delivery.
    assert rows(page) == s.tasks
    moves = orm(
        lambda: {
            str(m.task_id): (
                m.pk,
                m.notice.state,
                Delivery.objects.filter(binding=m.old_binding).exclude(kind="notice").latest("id"),
            )
            for m in ChannelMove.objects.filter(rebind_id=s.rebind).select_related("notice")
        }
    )
    for task_id in s.tasks:
        _, notice, last = moves[task_id]
        cells = row(page, task_id)
        assert cells.locator("td.c-task-state").inner_text() == "working"
        assert cells.locator("td.c-notice").inner_text() == notice
        assert cells.locator("td.c-last-delivery").inner_text().endswith(f"status {last.state}")
        assert re.fullmatch(r"\d+ s", cells.locator("td.c-since").inner_text())
        link = cells.locator("td.c-task a")
        assert link.get_attribute("href") == f"/admin/tasks/task/{task_id}/change/"
    page.screenshot(path=str(artifacts / "page.png"), full_page=True)

    # A second operator's browser watches the page; it is never reloaded.
    watcher = page.context.browser.new_context(base_url=page.url.split("/admin/")[0])
    watching = watcher.new_page()
    watching.set_default_timeout(TIMEOUT_MS)
    log_in(watching)
    watching.goto(f"{REBINDS}{s.rebind}/change/")
    watching.wait_for_selector(f"#rebind-on-old-rows tr[data-task='{s.tasks[0]}']")
    watching.evaluate("window.notReloaded = true")

    # Move the first task now.
    row(page, s.tasks[0]).locator("input.rb-select").check()
    page.click("#rebind-move-now")
    summary = confirm(page, artifacts, "move-now")
    assert summary.startswith("Move 1 task now: "), summary
    assert "1 task(s) moved now" in message(page)
    assert rows(page) == s.tasks[1:]
    watching.wait_for_function(
        f"() => !document.querySelector(\"#rebind-on-old-rows tr[data-task='{s.tasks[0]}']\")"
    )
    assert watching.evaluate("window.notReloaded") is True
    # Not exact: the page polls every 3 s, however long the move took to show.
    assert int(watching.locator("#rebind-console").get_attribute("data-polls")) >= 1
    assert watching.locator("#rebind-progress-text").inner_text() == (
        "2 of 3 left on the old version"
    )
    watching.screenshot(path=str(artifacts / "watcher-after-move.png"), full_page=True)
    watcher.close()
    moved = orm(lambda: ChannelMove.objects.get(pk=moves[s.tasks[0]][0]).state)
    assert moved == MoveState.MOVED
    audit = orm(lambda: list(OperatorAction.objects.filter(action="rebind_move_now").values()))
    assert [(a["actor"], a["target"]["moves"]) for a in audit] == [("admin", 1)]

    # Let the second finish on the old channel: it stays listed, finishing on old.
    row(page, s.tasks[1]).locator("input.rb-select").check()
    page.click("#rebind-finish-on-old")
    summary = confirm(page, artifacts, "finish-on-old")
    assert summary.startswith("Let 1 task finish on the old channel: "), summary
    assert row(page, s.tasks[1]).locator("td.c-move").get_attribute("data-state") == (
        "finishing_on_old"
    )
    finishing = orm(lambda: ChannelMove.objects.get(pk=moves[s.tasks[1]][0]).state)
    assert finishing == MoveState.FINISHING_ON_OLD

    # Extend the deadline by 7 minutes.
    before = orm(lambda: Rebind.objects.get(pk=s.rebind).deadline)
    page.fill("#rebind-minutes", "7")
    page.click("#rebind-extend")
    summary = confirm(page, artifacts, "extend")
    assert summary.startswith("Extend the deadline by 7 minutes: from "), summary
    after = orm(lambda: Rebind.objects.get(pk=s.rebind).deadline)
    assert after - before == timedelta(minutes=7)
    assert re.fullmatch(r"in 1 h \d+ min \d+ s", page.locator("#rebind-countdown").inner_text())
    page.screenshot(path=str(artifacts / "extended.png"), full_page=True)

    # Cut over: the two left are orphaned; no button is enabled any more.
    page.click("#rebind-cut-over")
    summary = confirm(page, artifacts, "cut-over")
    assert summary.startswith("Cut over: 2 tasks still on old will be orphaned"), summary
    assert page.locator("#rebind-state-chip").inner_text() == "cut over"
    assert page.locator("#rebind-state").inner_text() == "cut over"
    assert page.locator("#rebind-title").inner_text() == "Rebind of shop-bot: cut over"
    # An ended rebind: no countdown, and a cut-over one is not a success (no full bar).
    assert page.locator("#rebind-countdown").inner_text() == ""
    assert page.locator("#rebind-progress-text").inner_text() == (
        "cut over: 1 task moved, 2 orphaned (waiting to be re-bound)"
    )
    assert page.locator("#rebind-progress-bar").evaluate("p => p.value") == 33
    assert page.locator("#rebind-progress").get_attribute("class") == "rb-tone-cut_over"
    assert rows(page) == []
    assert page.locator("#rebind-on-old-rows").inner_text() == "no task is on the old version"
    buttons = page.locator("#rebind-buttons button")
    assert buttons.count() == 6
    assert buttons.evaluate_all("bs => bs.every(b => b.disabled)")
    page.screenshot(path=str(artifacts / "cut-over.png"), full_page=True)
    state, orphans = orm(
        lambda: (
            Rebind.objects.get(pk=s.rebind).state,
            ChannelMove.objects.filter(rebind_id=s.rebind, state=MoveState.ORPHANED).count(),
        )
    )
    assert (state, orphans) == ("cut_over", 2)

    # Abort the other agent's rebind, with a reason.
    page.goto(f"{REBINDS}{s.other}/change/")
    page.wait_for_selector("#rebind-on-old-rows tr[data-task]")
    page.fill("#rebind-reason", "wrong prefix")
    page.click("#rebind-abort")
    summary = confirm(page, artifacts, "abort")
    assert summary.startswith("Abort: 1 task still on old stay on their old channel"), summary
    assert page.locator("#rebind-state-chip").inner_text() == "aborted"
    assert page.locator("#rebind-countdown").inner_text() == ""
    assert page.locator("#rebind-progress-text").inner_text() == (
        "aborted: 0 tasks moved, 1 returned to the old channel"
    )
    assert page.locator("#rebind-progress-bar").evaluate("p => p.value") == 0
    assert "draining" not in page.locator("#content").inner_text()
    assert rows(page) == []
    page.screenshot(path=str(artifacts / "aborted.png"), full_page=True)
    aborted = orm(
        lambda: (
            Rebind.objects.get(pk=s.other).state,
            OperatorAction.objects.get(action="rebind_abort").target["reason"],
        )
    )
    assert aborted == ("aborted", "wrong prefix")
    # What the aborted rebind's page shows: the reason as stored, a deadline that no longer
    # counts, a finish time, and the counts of its one task.
    assert page.locator("#rebind-reason-shown").inner_text() == "aborted: wrong prefix"
    assert page.locator("#rebind-deadline-then").inner_text() == "(no longer counts: aborted)"
    assert page.locator("#rebind-finished").inner_text() not in ("", "-")
    # No worker ran: its notice was still pending, so the abort withdrew it.
    assert page.locator("#rebind-counts").inner_text() == (
        "1 planned; 0 moved; 1 returned to the old channel; "
        "notices: 0 delivered, 0 pending, 0 dead-lettered, 1 withdrawn"
    )


def test_a_viewer_sees_the_page_without_buttons_and_cannot_post(scene, page, artifacts):  # noqa: F811
    s = scene
    page.goto("/admin/login/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#dashboard")
    page.goto(f"{REBINDS}{s.rebind}/change/")
    page.wait_for_selector("#rebind-on-old-rows tr[data-task]")
    assert rows(page) == s.tasks
    assert page.locator("#rebind-state-chip").inner_text() == "draining"
    assert page.locator("#rebind-buttons").count() == 0
    assert page.locator("#rebind-console button, #rebind-console input.rb-select").count() == 0
    page.screenshot(path=str(artifacts / "viewer-page.png"), full_page=True)

    token = page.evaluate(
        "document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1]"
    )
    headers = {"X-CSRFToken": token, "Referer": page.url}
    audited = orm(OperatorAction.objects.count)
    for action in ("move_now", "finish_on_old", "cut_over", "extend", "abort"):
        form = {"confirm": "yes", "move": "1", "minutes": "5", "reason": "forged"}
        answer = page.request.post(f"{REBINDS}{s.rebind}/do/{action}/", form=form, headers=headers)
        assert answer.status == 403, action
        assert "CSRF" not in answer.text()  # refused for the permission, not the token
    assert orm(lambda: Rebind.objects.get(pk=s.rebind).state) == "draining"
    assert orm(OperatorAction.objects.count) == audited

    # The deadline passes (written directly: what the page shows of it, not the monitor).
    orm(
        lambda: Rebind.objects.filter(pk=s.rebind).update(
            deadline=timezone.now() - timedelta(minutes=2)
        )
    )
    page.wait_for_function(
        "() => document.getElementById('rebind-countdown').textContent.startsWith('overdue by')"
    )
    assert re.fullmatch(r"overdue by 2 min \d+ s", page.locator("#rebind-countdown").inner_text())
    page.screenshot(path=str(artifacts / "viewer-overdue.png"), full_page=True)


def test_buttons_follow_the_state_and_an_illegal_one_is_a_message(scene, page, artifacts):  # noqa: F811
    s = scene
    log_in(page)
    page.goto(f"{REBINDS}{s.scheduled}/change/")
    page.wait_for_selector("#rebind-on-old-rows tr")
    assert page.locator("#rebind-state-chip").inner_text() == "scheduled"
    assert page.locator("#rebind-deadline").inner_text() == "none"
    assert page.locator("#rebind-countdown").inner_text() == ""
    enabled = page.locator("#rebind-buttons button:not([disabled])").evaluate_all(
        "bs => bs.map(b => b.dataset.action)"
    )
    assert enabled == ["abort"]  # rebind_machine: a scheduled rebind can only be aborted
    page.screenshot(path=str(artifacts / "scheduled.png"), full_page=True)

    # A forged cut-over of the scheduled rebind: a message on its page, nothing changed.
    token = page.evaluate(
        "document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1]"
    )
    answer = page.request.post(
        f"{REBINDS}{s.scheduled}/do/cut_over/",
        form={"confirm": "yes"},
        headers={"X-CSRFToken": token, "Referer": page.url},
    )
    assert answer.status == 200  # the redirect to the page, followed
    assert answer.url.endswith(f"{REBINDS}{s.scheduled}/change/")
    assert "cannot cut over a rebind that is scheduled" in answer.text()
    assert orm(lambda: Rebind.objects.get(pk=s.scheduled).state) == "scheduled"


def test_a_stuck_notice_is_seen_and_replayed_from_the_rebind_page(page, artifacts):  # noqa: F811
    """A drain whose notices the client's receiver refuses (400, a body saying why): each
    task is stuck on the old channel, said on its row with the receiver's answer and on the
    task's page; "Replay notice" on one row re-sends that notice (after its confirmation),
    the receiver now takes it, and the watching page moves the task off the list, then shows
    the rebind completed, with no countdown and nothing saying "draining", without a reload."""
    receiver = Receiver()
    try:
        _stuck_notice(page, artifacts, receiver)
    finally:
        receiver.stop()


def _stuck_notice(page, artifacts, receiver) -> None:  # noqa: F811
    def setup():
        get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
        agent = AgentFactory(slug="stuck-bot")
        ids = in_flight(agent, 2, receiver.prefix("v1"))
        req = RebindRequest(
            agent=agent,
            move_from=receiver.prefix("v1"),
            move_to=receiver.prefix("v2"),
            deadline_seconds=3600,
        )
        rebind = rebind_start(req, actor="ops")
        assert rebind.state == "draining", rebind.reason
        deliver_due(ids)
        return str(rebind.pk), ids

    rebind, ids = orm(setup)
    log_in(page)
    page.goto(f"{REBINDS}{rebind}/change/")
    page.wait_for_selector("#rebind-on-old-rows tr[data-task]")
    assert rows(page) == ids
    for task_id in ids:
        cells = row(page, task_id)
        assert cells.locator("td.c-move").inner_text() == (
            "stuck on the old channel: its notice was dead-lettered"
        )
        notice = cells.locator("td.c-notice")
        assert notice.inner_text().startswith(f"dead-lettered (HTTP 400: {REFUSAL})")
        assert notice.locator("button.rb-replay").inner_text() == "Replay notice"
    assert page.locator("#rebind-replay-notices").inner_text() == "Replay dead notices (2)"
    assert page.locator("#rebind-replay-notices").is_enabled()
    counts = page.locator("#rebind-counts").inner_text()
    assert "notices: 0 delivered, 0 pending, 2 dead-lettered" in counts, counts
    page.screenshot(path=str(artifacts / "stuck.png"), full_page=True)

    # The task's page says the same.
    page.goto(f"/admin/tasks/task/{ids[0]}/change/")
    history = page.locator("#channel-history").inner_text()
    assert "stuck on the old channel: its notice was dead-lettered (HTTP 400: " in history
    assert page.locator("#channel-notices td.c-answer").inner_text() == f"HTTP 400: {REFUSAL}"
    page.screenshot(path=str(artifacts / "task-stuck.png"), full_page=True)

    # Replay the first row's notice once the receiver is fixed.
    receiver.notice_status = 200
    page.goto(f"{REBINDS}{rebind}/change/")
    page.wait_for_selector("#rebind-on-old-rows tr[data-task]")
    row(page, ids[0]).locator("button.rb-replay").click()
    summary = confirm(page, artifacts, "replay")
    assert summary.startswith("Replay 1 dead-lettered notice: "), summary
    assert "1 of 1 dead notice(s) replayed" in message(page)
    notices = orm(
        lambda: dict(
            Delivery.objects.filter(task_id__in=ids, kind="notice").values_list("task_id", "state")
        )
    )
    assert {str(k): v for k, v in notices.items()} == {ids[0]: "pending", ids[1]: "dead"}
    audit = orm(lambda: OperatorAction.objects.get(action="replay_deliveries").actor)
    assert audit == "admin"

    # A worker delivers it: the page, never reloaded, sees the task leave the list.
    page.evaluate("window.notReloaded = true")
    orm(lambda: deliver_due(ids))
    page.wait_for_function(
        f"() => !document.querySelector(\"#rebind-on-old-rows tr[data-task='{ids[0]}']\")"
    )
    assert page.locator("#rebind-replay-notices").inner_text() == "Replay dead notices (1)"
    page.screenshot(path=str(artifacts / "replayed.png"), full_page=True)

    # Then the rest through "Replay dead notices", and the rebind completes.
    page.click("#rebind-replay-notices")
    summary = confirm(page, artifacts, "replay-all")
    assert summary.startswith("Replay 1 dead-lettered notice: "), summary
    page.evaluate("window.notReloaded = true")
    orm(lambda: deliver_due(ids))
    orm(lambda: rebind_advance(rebind))
    page.wait_for_function(
        "() => document.getElementById('rebind-state-chip').textContent === 'completed'"
    )
    assert page.evaluate("window.notReloaded") is True
    assert page.locator("#rebind-title").inner_text() == "Rebind of stuck-bot: completed"
    assert page.title().startswith("Rebind of stuck-bot: completed | ")
    assert page.locator("#rebind-state").inner_text() == "completed"
    assert page.locator("#rebind-countdown").inner_text() == ""
    assert page.locator("#rebind-progress-text").inner_text() == "completed: 2 tasks moved"
    assert page.locator("#rebind-progress").get_attribute("class") == "rb-tone-done"
    assert rows(page) == []
    moves = page.locator("#rebind-moves-rows td.c-move").all_inner_texts()
    assert moves == ["moved to the new channel"] * 2
    assert "draining" not in page.locator("#content").inner_text()
    assert page.locator("#rebind-replay-notices").is_disabled()
    page.screenshot(path=str(artifacts / "completed.png"), full_page=True)
