"""The console's key, task and push config pages (issue 16; Django's test client, PostgreSQL).

Signing keys on the agent's page: public parts only, rotation is the rebind wizard
prefilled, a retiring key's retirement confirms, then retires through
webhooks/console/key_actions.py (audited; refused while an open rebind holds the key, and to anyone
without run_rebind). A task's page shows its channel history; a push config's page its versions
with the credentials masked. Everything is written by the services; tasks and their push configs
through the protocol.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from agents.models import OperatorAction, SigningKey, SigningKeyState
from agents.signing import signing_key_rotate
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.factories import AgentFactory
from tests.protocol_push import open_task
from webhooks.models import PushConfig
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_start

pytestmark = pytest.mark.usefixtures("public_dns")

V1 = "https://hooks.example.org/v1/"
V2 = "https://hooks.example.org/v2/"


@pytest.fixture
def agent(transactional_db):
    # Transactional: tasks are opened through the protocol app, whose ORM calls run on other
    # threads (tests/protocol_push.py).
    return AgentFactory(slug="shop-bot", executor="external")


def in_flight(agent, config: dict) -> Task:
    """A WORKING task opened through the protocol with `config` inline, as a client opens it."""
    task = Task.objects.get(pk=open_task(agent, push=config))
    services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
    return task


def test_agent_page_lists_public_key_parts_and_links_rotation_to_the_wizard(agent, superuser):
    old = SigningKey.objects.get(agent=agent)
    new = signing_key_rotate(agent=agent)
    html = superuser.get(f"/admin/agents/agent/{agent.pk}/change/").content.decode()
    for kid in (old.kid, new.kid):
        assert kid in html
    assert "EdDSA" in html
    assert old.private_key_encrypted not in html
    assert f'/admin/webhooks/rebind/retire-key/{old.pk}/"' in html  # retiring: retirable
    assert f"/admin/webhooks/rebind/retire-key/{new.pk}/" not in html  # active: rotate first
    rotate = "/admin/webhooks/rebind/start/?agent=shop-bot&amp;operations=rotate_key"
    assert rotate in html

    form = superuser.get(rotate.replace("&amp;", "&")).context["form"]
    assert form.initial == {"agent": "shop-bot", "operations": ["rotate_key"]}


def test_retiring_a_key_confirms_then_retires_and_audits(agent, superuser):
    old = SigningKey.objects.get(agent=agent)
    signing_key_rotate(agent=agent)
    url = f"/admin/webhooks/rebind/retire-key/{old.pk}/"
    page = superuser.get(url)
    assert page.status_code == 200
    assert f"Yes, retire {old.kid}" in page.content.decode()
    assert SigningKey.objects.get(pk=old.pk).state == SigningKeyState.RETIRING  # GET: nothing

    response = superuser.post(url, follow=True)

    assert response.redirect_chain[-1][0] == f"/admin/agents/agent/{agent.pk}/change/"
    assert f"Key {old.kid} retired" in response.content.decode()
    assert SigningKey.objects.get(pk=old.pk).state == SigningKeyState.RETIRED
    audit = OperatorAction.objects.get(action="retire_signing_key")
    assert (audit.actor, audit.target) == ("admin", {"agent": agent.pk, "kid": old.kid})


def test_a_key_an_open_rebind_uses_is_not_retired(agent, superuser):
    in_flight(agent, {"id": "c", "url": f"{V1}t"})
    rebind = rebind_start(RebindRequest(agent=agent, rotate_key=True), actor="ops")
    assert rebind.is_open
    held = rebind.old_key
    signing_key_rotate(agent=agent)  # even once it is no longer the active key
    held.refresh_from_db()
    before = (held.state, held.retired_at)

    response = superuser.post(f"/admin/webhooks/rebind/retire-key/{held.pk}/", follow=True)

    assert f"in use by open rebind {rebind.pk}" in response.content.decode()
    held.refresh_from_db()
    assert (held.state, held.retired_at) == before
    assert not OperatorAction.objects.filter(action="retire_signing_key").exists()


def test_the_active_key_is_not_retired(agent, superuser):
    key = SigningKey.objects.get(agent=agent)
    response = superuser.post(f"/admin/webhooks/rebind/retire-key/{key.pk}/", follow=True)
    assert "rotate before retiring it" in response.content.decode()
    assert SigningKey.objects.get(pk=key.pk).state == SigningKeyState.ACTIVE


def test_retiring_needs_run_rebind(agent, client):
    old = SigningKey.objects.get(agent=agent)
    signing_key_rotate(agent=agent)
    viewer = get_user_model().objects.create_user("viewer", password="x", is_staff=True)
    viewer.user_permissions.set(
        Permission.objects.filter(codename__in=["view_agent", "view_signingkey", "view_rebind"])
    )
    client.force_login(viewer)
    assert client.get(f"/admin/webhooks/rebind/retire-key/{old.pk}/").status_code == 403
    assert client.post(f"/admin/webhooks/rebind/retire-key/{old.pk}/").status_code == 403
    assert SigningKey.objects.get(pk=old.pk).state == SigningKeyState.RETIRING
    assert client.get("/admin/webhooks/rebind/retire-key/999999/").status_code == 403


def test_unknown_key_is_404(superuser):
    assert superuser.get("/admin/webhooks/rebind/retire-key/999999/").status_code == 404


def test_task_page_shows_its_channel_history(agent, superuser):
    task = in_flight(agent, {"id": "c", "url": f"{V1}t?k=query-secret"})
    rebind = rebind_start(RebindRequest(agent=agent, move_from=V1, move_to=V2), actor="ops")

    html = superuser.get(f"/admin/tasks/task/{task.id}/change/").content.decode()

    assert 'id="channel-history"' in html
    # v1 takes no new deliveries (retired) but still carries the notice; v2 waits for it.
    assert "<td>c.v1</td><td>retired</td><td>https://hooks.example.org/v1/t?…</td>" in html
    assert "<td>c.v2</td><td>waiting</td><td>https://hooks.example.org/v2/t?…</td>" in html
    # The move: its rebind linked, its state by its label (webhooks/admin/push_configs.py).
    link = f'<a href="/admin/webhooks/rebind/{rebind.pk}/change/">{str(rebind.pk)[:8]}</a>'
    assert (
        f"<td>{link}</td><td>c</td><td>v1 → v2</td><td>notice pending on the old channel</td>"
        in html
    )
    assert "channel-changed" in html  # the notice on the old version
    assert "query-secret" not in html


def test_push_config_page_masks_credentials(agent, superuser):
    config = {
        "id": "c",
        "url": f"{V1}t",
        "token": "tok-secret",
        "authentication": {"scheme": "Basic", "credentials": "cred-secret"},
    }
    task = in_flight(agent, config)
    push = PushConfig.objects.get(task=task)

    html = superuser.get(f"/admin/webhooks/pushconfig/{push.pk}/change/").content.decode()

    assert "token set; Basic: credentials set" in html
    assert "tok-secret" not in html
    assert "cred-secret" not in html
