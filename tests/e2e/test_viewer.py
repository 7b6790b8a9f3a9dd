"""A member of the "viewer" group (webhooks/console/operator_groups.py) in a real browser (Debian's
chromium via Playwright, as test_admin.py): it sees every console page — the dashboard,
deliveries with their attempts, endpoints, push configs, rebinds with their moves, the
agent's keys, a task's channel history — and can do nothing: no action, no wizard, no
retirement, and forged posts change no row (issue 16). A full-page screenshot of each page
goes to the `artifacts` directory.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from agents.models import OperatorAction, SigningKey
from agents.signing import signing_key_rotate
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.deliveries import delivery_claim_head, delivery_record
from tests.e2e.test_admin import PASSWORD
from tests.e2e.test_admin import page as page  # noqa: F401 (the browser fixture)
from tests.e2e.test_admin_deliveries import orm, sent
from tests.factories import AgentFactory
from tests.protocol_push import live_open_task
from webhooks.delivery import ssrf
from webhooks.models import Delivery, Endpoint, PushConfig, Rebind
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_start

V1 = "https://hooks.example.org/v1/"
V2 = "https://hooks.example.org/v2/"


@dataclass(frozen=True)
class Scene:
    agent_pk: int
    task_id: str
    delivery_pk: int
    config_pk: int
    endpoint_pk: int
    rebind_pk: str
    retiring_key_pk: int


@pytest.fixture
def scene(transactional_db, monkeypatch, asgi_server) -> Scene:
    monkeypatch.setattr(ssrf, "resolve", lambda host, port: ["93.184.215.14"])
    viewer = get_user_model().objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.groups.add(Group.objects.get(name="viewer"))
    agent = AgentFactory(slug="shop-bot", executor="external")
    # Opened through the server the browser uses, its config inline, as a client opens it
    # (the binding's issuer is that server's URL): the config the rebind below moves.
    task = Task.objects.get(
        pk=live_open_task(asgi_server.url, agent, push={"id": "c", "url": f"{V1}t"})
    )
    config = PushConfig.objects.get(task=task, config_id="c")
    claim = delivery_claim_head(config_pk=config.pk)
    delivery_record(claim=claim, result=sent(503, None, 12.0))
    services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
    old = SigningKey.objects.get(agent=agent)
    signing_key_rotate(agent=agent)  # the old key is retiring: retirable by an operator
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")
    return Scene(
        agent_pk=agent.pk,
        task_id=str(task.id),
        delivery_pk=claim.delivery_pk,
        config_pk=config.pk,
        endpoint_pk=Endpoint.objects.get().pk,
        rebind_pk=str(rebind.pk),
        retiring_key_pk=old.pk,
    )


def snapshot() -> dict:
    return {
        "deliveries": list(Delivery.objects.order_by("pk").values()),
        "endpoints": list(Endpoint.objects.order_by("pk").values()),
        "rebinds": list(Rebind.objects.order_by("pk").values()),
        "keys": list(SigningKey.objects.order_by("pk").values()),
        "configs": list(PushConfig.objects.order_by("pk").values()),
        "audit": OperatorAction.objects.count(),
    }


def test_a_viewer_sees_every_page_and_can_do_nothing(scene, page, artifacts):  # noqa: F811
    s = scene
    before = orm(snapshot)
    page.goto("/admin/login/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#dashboard")
    page.screenshot(path=str(artifacts / "dashboard.png"), full_page=True)

    pages = {
        "deliveries": ("/admin/webhooks/delivery/", "#result_list"),
        "delivery": (f"/admin/webhooks/delivery/{s.delivery_pk}/change/", "#attempts_log-group"),
        "endpoints": ("/admin/webhooks/endpoint/", "#result_list"),
        "push-config": (f"/admin/webhooks/pushconfig/{s.config_pk}/change/", "#bindings-group"),
        "rebinds": ("/admin/webhooks/rebind/", "#result_list"),
        # The rebind's console: its live list of the task still on the old version.
        "rebind": (
            f"/admin/webhooks/rebind/{s.rebind_pk}/change/",
            f"#rebind-on-old-rows tr[data-task='{s.task_id}']",
        ),
        "moves": ("/admin/webhooks/channelmove/", "#result_list"),
        "agent": (f"/admin/agents/agent/{s.agent_pk}/change/", "#signing_keys-group"),
        "task": (f"/admin/tasks/task/{s.task_id}/change/", "#channel-history"),
    }
    for name, (url, selector) in pages.items():
        page.goto(url)
        page.wait_for_selector(selector)  # it sees the page and its content
        assert page.locator("select[name=action]").count() == 0, name
        assert page.locator("input[name=_save]").count() == 0, name
        page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)
    page.goto(pages["delivery"][0])
    failure = page.locator("#attempts_log-group td.field-failure").inner_text()
    assert failure == "HTTP 503 Service Unavailable from the receiver"
    page.goto(pages["rebinds"][0])
    assert page.get_by_role("link", name="Start a rebind").count() == 0

    refused = {
        "wizard": page.request.get("/admin/webhooks/rebind/start/").status,
        "retire": page.request.get(
            f"/admin/webhooks/rebind/retire-key/{s.retiring_key_pk}/"
        ).status,
    }
    assert refused == {"wizard": 403, "retire": 403}
    token = page.evaluate(
        "document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1]"
    )
    forged = [
        ("/admin/webhooks/rebind/", "abort", s.rebind_pk),
        ("/admin/webhooks/rebind/", "cut_over", s.rebind_pk),
        ("/admin/webhooks/delivery/", "retry_now", str(s.delivery_pk)),
        ("/admin/webhooks/delivery/", "replay", str(s.delivery_pk)),
        ("/admin/webhooks/endpoint/", "pause", str(s.endpoint_pk)),
        ("/admin/webhooks/endpoint/", "send_test", str(s.endpoint_pk)),
    ]
    headers = {"X-CSRFToken": token, "Referer": page.url}
    for url, action, pk in forged:
        form = {"action": action, "_selected_action": pk, "index": "0"}
        page.request.post(url, form=form, headers=headers)
    page.request.post(
        f"/admin/webhooks/rebind/retire-key/{s.retiring_key_pk}/", form={}, headers=headers
    )
    assert orm(snapshot) == before  # no state changed, no audit row
