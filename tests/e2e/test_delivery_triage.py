"""Delivery triage in a real browser at a laptop's width (1366 x 768; Debian's chromium via
Playwright, as test_admin.py), the way an operator used to Svix's or Stripe's dashboards
would try it (issue 16).

The deliveries are real sends: the services register push configs, the real claim sends
through webhooks/delivery/transport.py to receivers in this process (an HTTP server answering 200 or
500, a closed port) and the real record writes the attempts. One endpoint is paused before
its delivery is tried. Then, in the browser: the list newest first with exact times, the
failure in words and the URL in view; a delivery's page with its attempts and the payload
and headers pretty-printed; "retry now" and a replay that says why it did nothing; the
endpoints with their last hour's success rate and latency; a signed test send that the
receiver gets, and one to a closed port that says "connection refused". A full-page
screenshot of each page goes to the `artifacts` directory (printed at the end).
"""

from __future__ import annotations

import base64
import json
import re
import socket
import uuid
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model

from agents import signing
from agents.models import OperatorAction
from agents.signing import live_private_keys
from tasks.models import Task
from tests.deliveries import delivery_claim_head, delivery_record
from tests.e2e.test_admin import PASSWORD, log_in
from tests.e2e.test_admin import page as page  # noqa: F401 (the browser fixture)
from tests.e2e.test_admin_deliveries import orm
from tests.factories import AgentFactory, task_create, user_message
from tests.integration.webhooks.test_transport import Receiver
from webhooks.delivery.transport import post
from webhooks.models import Delivery, DeliveryState
from webhooks.receiver import TEST_EVENT_URI, ChannelTrust, WebhookVerifier
from webhooks.services import endpoint_pause, push_config_create

DELIVERIES = "/admin/webhooks/delivery/"
ENDPOINTS = "/admin/webhooks/endpoint/"
SECRET = "query-secret-never-shown"
LAPTOP = {"width": 1366, "height": 768}


@dataclass(frozen=True)
class Scene:
    refused: str  # event ids: connection refused, waiting for its next try
    failed: str  # HTTP 500, waiting for its next try
    delivered: str
    paused: str  # pending, its endpoint paused, never tried
    receiver_origin: str
    refused_origin: str
    agent_pk: int


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def receiver():
    r = Receiver()
    r.thread.start()
    yield r
    r.stop()


@pytest.fixture
def scene(transactional_db, settings, receiver) -> Scene:
    """Written before the browser starts (Playwright's loop runs on this thread)."""
    settings.A2A_WEBHOOK_RETRY_SCHEDULE = ["600", "600"]  # three tries, the next one later
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
    agent = AgentFactory(slug="shop-bot", executor="external")

    def registered(config_id: str, url: str) -> int:
        task = task_create(agent=agent, owner="anonymous", message=user_message("hi"))
        config = {"id": config_id, "url": url, "token": "tok-never-shown"}
        return push_config_create(task=task, config=config).config.pk

    def sent(config_pk: int) -> str:
        claim = delivery_claim_head(config_pk=config_pk)
        assert claim is not None
        delivery_record(claim=claim, result=post(claim.url, claim.body, claim.headers, timeout=5))
        return str(Delivery.objects.get(pk=claim.delivery_pk).event_id)

    port = closed_port()
    refused = sent(registered("refused", f"http://127.0.0.1:{port}/hook?key={SECRET}"))
    failed = sent(registered("failing", receiver.url("/fail")))
    delivered = sent(registered("fine", receiver.url(f"/ok?key={SECRET}")))
    paused_pk = registered("paused", f"http://127.0.0.1:{closed_port()}/held")
    paused = Delivery.objects.get(config_id=paused_pk)
    endpoint_pause(endpoint_pk=paused.binding.endpoint_id, actor="setup", reason="maintenance")
    states = dict(Delivery.objects.values_list("event_id", "state"))
    assert [states[uuid.UUID(e)] for e in (refused, failed, delivered)] == [
        DeliveryState.PENDING,
        DeliveryState.PENDING,
        DeliveryState.DELIVERED,
    ]
    return Scene(
        refused=refused,
        failed=failed,
        delivered=delivered,
        paused=str(paused.event_id),
        receiver_origin=f"http://127.0.0.1:{receiver.port}",
        refused_origin=f"http://127.0.0.1:{port}",
        agent_pk=agent.pk,
    )


def row(page, event_id: str):
    return page.locator("#result_list tbody tr", has_text=event_id)


def cell(page, event_id: str, column: str) -> str:
    return row(page, event_id).locator(f"td.field-{column}").inner_text()


def fits_the_width(page) -> None:
    """No horizontal scrolling: every column of the list lies within the window."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= LAPTOP["width"], width
    for column in ("last_failure", "receiver", "next_try"):
        box = page.locator(f"#result_list thead th.column-{column}").bounding_box()
        assert box is not None, column
        assert box["x"] + box["width"] <= LAPTOP["width"], (column, box)


def run_action(page, action: str, *event_ids: str) -> str:
    for event_id in event_ids:
        row(page, event_id).locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    page.locator("#changelist-form button[name=index]").click()
    page.wait_for_selector("ul.messagelist")
    return page.locator("ul.messagelist").inner_text()


def test_triage_the_deliveries_list_and_a_delivery_page(scene, page, artifacts):  # noqa: F811
    page.set_viewport_size(LAPTOP)
    log_in(page)
    page.goto(DELIVERIES)
    page.wait_for_selector("#result_list")
    ids = page.locator("#result_list tbody th.field-event_id").all_inner_texts()
    assert ids == [scene.paused, scene.delivered, scene.failed, scene.refused]  # newest first
    created = page.locator("#result_list tbody td.field-created").all_inner_texts()
    # The console's one time format: UTC to the second, a relative hint, no microseconds.
    one_format = r"\d\d:\d\d:\d\d UTC · \d+ (s|min|h|d) ago"
    assert all(re.fullmatch(one_format, t) for t in created), created
    instants = page.locator("#result_list tbody td.field-created time").evaluate_all(
        "nodes => nodes.map(n => n.getAttribute('datetime'))"
    )
    assert len(instants) == len(created)
    assert instants == sorted(instants, reverse=True)

    assert cell(page, scene.refused, "last_failure").startswith("connection refused (")
    assert cell(page, scene.failed, "last_failure") == (
        "HTTP 500 Internal Server Error from the receiver"
    )
    assert cell(page, scene.delivered, "last_failure") == "-"
    assert cell(page, scene.refused, "attempt_of") == "1 of 3"
    assert cell(page, scene.paused, "attempt_of") == "0 of 3"
    assert cell(page, scene.paused, "state_shown").startswith("paused")
    assert cell(page, scene.paused, "next_try") == "waiting (endpoint paused)"
    assert cell(page, scene.refused, "state_shown").split() == ["pending", "snapshot"]
    receiver_cell = cell(page, scene.delivered, "receiver")
    assert receiver_cell.startswith(f"{scene.receiver_origin}/ok?…")
    assert SECRET not in page.content()
    page.screenshot(path=str(artifacts / "deliveries.png"), full_page=True)
    fits_the_width(page)

    row(page, scene.refused).locator("th.field-event_id a").click()
    page.wait_for_selector("#attempts_log-group")
    attempt = page.locator("#attempts_log-group tbody tr.has_original")
    assert attempt.count() == 1
    assert attempt.locator("td.field-attempt_of").inner_text() == "1 of 3"
    assert attempt.locator("td.field-failure").inner_text().startswith("connection refused (")
    assert attempt.locator("td.field-url_shown").inner_text() == f"{scene.refused_origin}/hook?…"
    headers = attempt.locator("td.field-headers_shown pre")
    text = headers.inner_text()
    assert '\n  "webhook-id": ' in text  # one header a line, indented
    assert '"X-A2A-Notification-Token": "<redacted>"' in text
    body = page.locator("div.field-body_preview pre").inner_text()
    stored = orm(lambda: Delivery.objects.get(event_id=scene.refused).body)
    assert json.loads(body) == json.loads(stored)  # the exact body, indented
    assert "\n" in body  # indented, not one line
    page.screenshot(path=str(artifacts / "delivery-page.png"), full_page=True)
    for pre in page.locator("pre.a2a-pre").all():  # wrapped: nothing runs off to the side
        assert pre.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    assert SECRET not in page.content()
    assert "tok-never-shown" not in page.content()


def test_triage_retry_now_and_a_replay_that_says_why(scene, page, artifacts):  # noqa: F811
    page.set_viewport_size(LAPTOP)
    log_in(page)
    page.goto(DELIVERIES)
    text = run_action(page, "retry_now", scene.refused, scene.delivered)
    assert "1 of 2 selected deliveries due now" in text
    assert "Not retried: 1 × delivered: only a delivery waiting to retry is retried" in text
    page.screenshot(path=str(artifacts / "retry-now.png"), full_page=True)
    next_try = cell(page, scene.refused, "next_try")

    page.goto(DELIVERIES)
    text = run_action(page, "replay", scene.failed)
    assert "0 of 1 selected deliveries re-opened" in text
    assert "Not replayed: 1 × pending: only dead-lettered or delivered" in text
    page.screenshot(path=str(artifacts / "replay-nothing.png"), full_page=True)

    def read():
        rows = {str(d.event_id): d for d in Delivery.objects.all()}
        audit = list(OperatorAction.objects.order_by("pk").values_list("action", "target"))
        return rows, audit

    rows, audit = orm(read)
    assert rows[scene.refused].next_attempt_at <= rows[scene.failed].next_attempt_at
    assert " UTC · " in next_try
    assert rows[scene.failed].state == DeliveryState.PENDING  # the replay changed nothing
    assert ("retry_deliveries_now", {"deliveries": [scene.refused]}) in audit


def test_triage_endpoint_health_and_a_signed_test_send(scene, page, receiver, artifacts):  # noqa: F811
    page.set_viewport_size(LAPTOP)
    log_in(page)
    page.goto(ENDPOINTS)
    page.wait_for_selector("#result_list")
    good = page.locator("#result_list tbody tr", has_text=scene.receiver_origin)
    assert good.locator("td.field-success_rate").inner_text() == "50.0% of 2"
    assert re.fullmatch(r"\d+ ms mean, \d+ ms max", good.locator("td.field-latency").inner_text())
    refused = page.locator("#result_list tbody tr", has_text=scene.refused_origin)
    assert refused.locator("td.field-success_rate").inner_text() == "0.0% of 1"
    assert refused.locator("td.field-state_shown").inner_text() == "failing"
    assert "paused" in page.locator("#result_list tbody").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"]
    page.screenshot(path=str(artifacts / "endpoints.png"), full_page=True)

    before = len(receiver.requests)
    good.locator("input.action-select").check()
    refused.locator("input.action-select").check()
    page.select_option("select[name=action]", "send_test")
    page.locator("#changelist-form button[name=index]").click()
    page.wait_for_selector("ul.messagelist")
    ok = page.locator("ul.messagelist li.success").inner_text()
    assert ok.lower().startswith(f"{scene.receiver_origin}: test event ")
    assert f"to {scene.receiver_origin}/ok?… (fine.v1): HTTP 200 in " in ok
    error = page.locator("ul.messagelist li.error").inner_text()
    assert error.lower().startswith(f"{scene.refused_origin}: test event ")
    assert ": no answer in " in error
    assert "connection refused (" in error
    page.screenshot(path=str(artifacts / "test-send.png"), full_page=True)

    [got] = receiver.requests[before:]
    headers = {k.lower(): v for k, v in got.headers}
    assert got.path == f"/ok?key={SECRET}"
    assert headers["x-a2a-event-kind"] == "test"
    assert headers["x-a2a-task-seq"] == "0"
    assert headers["x-a2a-notification-token"] == "tok-never-shown"
    event = json.loads(got.body)
    assert event["statusUpdate"]["metadata"][TEST_EVENT_URI]["sentBy"] == "admin"
    # A test, not a real task's update: a task id of its own (the header's too), no state.
    test_task = event["statusUpdate"]["taskId"]
    assert not orm(lambda: Task.objects.filter(pk=test_task).exists())
    assert headers["x-a2a-task-id"] == test_task
    assert event["statusUpdate"]["status"]["state"] == "TASK_STATE_UNSPECIFIED"
    # The strict receiver accepts it and reports it as a test; a real update is not one.
    verifier = WebhookVerifier(jwks=orm(lambda: signing.jwks(_agent(scene))))
    verified = verifier.verify(dict(got.headers), got.body, channels=ChannelTrust())
    assert verified.is_test
    assert verified.task_id == test_task
    # Signed as deliveries are (Standard Webhooks v1a, Ed25519 over id.timestamp.body) with
    # the agent's live key; checked with the public key alone.
    public = orm(lambda: [k.public_key() for _, k in live_private_keys(_agent(scene))])
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + got.body
    signatures = [s.removeprefix("v1a,") for s in headers["webhook-signature"].split()]
    public[0].verify(base64.b64decode(signatures[0]), signed)  # raises when it does not verify

    audit = orm(
        lambda: list(
            OperatorAction.objects.filter(action="send_test_event")
            .order_by("pk")
            .values_list("target", flat=True)
        )
    )
    assert {(t["endpoint"], t["status"]) for t in audit} == {
        (f"{scene.receiver_origin}", 200),
        (f"{scene.refused_origin}", None),
    }


def _agent(scene: Scene):
    from agents.models import Agent

    return Agent.objects.get(pk=scene.agent_pk)


def test_triage_viewer_cannot_retry_or_test_send(scene, page, artifacts):  # noqa: F811
    """A staff user with view permissions only is offered neither action, and a forged
    post changes nothing."""

    def viewer():
        from django.contrib.auth.models import Permission

        user = get_user_model().objects.create_user("viewer", password=PASSWORD, is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="webhooks",
                codename__in=["view_delivery", "view_deliveryattempt", "view_endpoint"],
            )
        )

    orm(viewer)
    page.goto("/admin/login/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    for changelist in (DELIVERIES, ENDPOINTS):
        page.goto(changelist)
        page.wait_for_selector("#result_list")
        assert page.locator("select[name=action]").count() == 0, changelist
        page.screenshot(path=str(artifacts / f"viewer-{changelist.split('/')[3]}.png"))
    before = orm(lambda: (list(Delivery.objects.values()), OperatorAction.objects.count()))
    token = page.evaluate(
        "document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1]"
    )
    pk = orm(lambda: Delivery.objects.get(event_id=scene.refused).pk)
    answer = page.request.post(
        DELIVERIES,
        form={"action": "retry_now", "_selected_action": str(pk), "index": "0"},
        headers={"X-CSRFToken": token, "Referer": page.url},
        max_redirects=0,
    )
    # Offered no action, the viewer's post is no action at all: the list, as a GET shows it
    # (an action run would redirect back to it).
    assert answer.status == 200
    after = orm(lambda: (list(Delivery.objects.values()), OperatorAction.objects.count()))
    assert after == before
