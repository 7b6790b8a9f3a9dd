"""Secrets are never rendered, searched or filterable in the admin (issue 16), and an agent's
rules are checked by its form, not in save_model.

A filter in the URL through a secret field (`?digest__startswith=ab`: counting the rows
finds a secret a prefix at a time) is refused with 400, as Django's UserAdmin refuses
`password` lookups, whatever the relation it goes through; the same lookup on a field that
is not secret still works. The stored secrets are made by the services (registrations, API
keys, tokens, a rebind replacing a config's credentials) and searched for in every page.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from a2a_platform.api.models import TokenScope
from a2a_platform.api.services import api_token_create
from agents.models import Agent, SigningKey
from agents.services import api_key_create
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests import protocol_push
from tests.factories import AgentFactory
from webhooks.models import PushBinding, PushConfig, Rebind
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_start

pytestmark = pytest.mark.usefixtures("public_dns")

REFUSED = [
    "/admin/agents/apikey/?digest__startswith=a",
    "/admin/agents/agent/?api_keys__digest__startswith=a",
    "/admin/agents/signingkey/?private_key_encrypted__startswith=g",
    "/admin/agents/agent/?signing_keys__private_key_encrypted__startswith=g",
    "/admin/platform_api/apitoken/?digest__startswith=a",
    "/admin/webhooks/pushconfig/?bindings__token_encrypted__startswith=g",
    "/admin/webhooks/pushconfig/?bindings__credentials_encrypted__isnull=False",
    "/admin/webhooks/delivery/?binding__token_encrypted__startswith=g",
    "/admin/webhooks/endpoint/?bindings__credentials_encrypted__startswith=g",
    "/admin/webhooks/rebind/?new_token_encrypted__startswith=g",
    "/admin/webhooks/rebind/?new_credentials_encrypted__gt=a",
    "/admin/webhooks/channelmove/?old_binding__token_encrypted__startswith=g",
    "/admin/tasks/task/?push_configs__bindings__token_encrypted__startswith=g",
]
ALLOWED = [
    "/admin/agents/apikey/?prefix__startswith=a",
    "/admin/agents/signingkey/?kid__startswith=a",
    "/admin/webhooks/rebind/?reason__startswith=a",
]
TOKEN = "webhook-token-secret"
CREDENTIALS = "webhook-credentials-secret"


@pytest.fixture
def secrets(transactional_db) -> list[str]:
    """Every kind of stored secret, written by the services (the push config through the
    protocol, as a client registers it); their clear and stored forms."""
    agent = AgentFactory(slug="shop-bot", executor="external")
    config = {
        "id": "c",
        "url": "https://hooks.example.org/hook",
        "token": TOKEN,
        "authentication": {"scheme": "Basic", "credentials": CREDENTIALS},
    }
    task = Task.objects.get(pk=protocol_push.open_task(agent, push=config))
    services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
    rebind_start(
        RebindRequest(
            agent=agent,
            config=PushConfig.objects.get(task=task),
            new_token="rebind-token-secret",
            new_auth_scheme="Bearer",
            new_credentials="rebind-credentials-secret",
        ),
        actor="ops",
    )
    key = api_key_create(agent=agent, name="client")
    admin = get_user_model().objects.create_superuser("admin", email="", password="x")
    scope = TokenScope.values[0]
    token = api_token_create(name="ci", scope=scope, user=admin, created_by=admin)
    stored = [key.key.digest, key.token, token.token.digest, token.secret]
    stored += list(SigningKey.objects.values_list("private_key_encrypted", flat=True))
    for b in PushBinding.objects.all():
        stored += [b.token_encrypted, b.credentials_encrypted]
    rebind = Rebind.objects.get()
    stored += [rebind.new_token_encrypted, rebind.new_credentials_encrypted]
    clear = [TOKEN, CREDENTIALS, "rebind-token-secret", "rebind-credentials-secret"]
    return [s for s in stored + clear if s]


@pytest.fixture
def operator(client, secrets):
    client.force_login(get_user_model().objects.get(username="admin"))
    return client


@pytest.mark.parametrize("url", REFUSED)
def test_a_lookup_through_a_secret_field_is_refused(operator, url):
    response = operator.get(url)
    assert response.status_code == 400, url


@pytest.mark.parametrize("url", ALLOWED)
def test_a_lookup_through_a_field_that_is_not_secret_still_works(operator, url):
    assert operator.get(url).status_code == 200, url


def test_no_admin_page_renders_a_secret(operator, secrets):
    agent = Agent.objects.get(slug="shop-bot")
    rebind = Rebind.objects.get()
    config = PushConfig.objects.get()
    pages = [
        f"/admin/agents/agent/{agent.pk}/change/",
        "/admin/agents/apikey/",
        "/admin/agents/signingkey/",
        "/admin/platform_api/apitoken/",
        "/admin/webhooks/pushconfig/",
        f"/admin/webhooks/pushconfig/{config.pk}/change/",
        "/admin/webhooks/delivery/",
        "/admin/webhooks/rebind/",
        f"/admin/webhooks/rebind/{rebind.pk}/change/",
        "/admin/webhooks/channelmove/",
        f"/admin/tasks/task/{config.task_id}/change/",
    ]
    for url in pages:
        response = operator.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        for secret in secrets:
            assert secret not in html, (url, secret[:12])
    html = operator.get(f"/admin/webhooks/rebind/{rebind.pk}/change/").content.decode()
    assert "new_token_encrypted" not in html
    assert "new_credentials_encrypted" not in html


def test_an_agent_edit_the_rules_refuse_comes_back_on_the_form(operator):
    agent = Agent.objects.get(slug="shop-bot")
    url = f"/admin/agents/agent/{agent.pk}/change/"
    form = operator.get(url).context["adminform"].form
    data = {}
    for name in form.fields:  # the page's own values, as a browser posts them
        value = form[name].value()
        if value is True:
            data[name] = "on"
        elif value is not False and value is not None:
            data[name] = value
    data["push_rebind_deadline"] = "0"  # the model allows it; agent_check does not
    for prefix in ("signing_keys", "api_keys", "card_versions"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    before = Agent.objects.filter(pk=agent.pk).values().get()

    response = operator.post(url, data)

    assert response.status_code == 200  # the form again, not a redirect
    errors = response.context["adminform"].form.errors
    assert "push_rebind_deadline" in errors, errors
    assert Agent.objects.filter(pk=agent.pk).values().get() == before

    data["push_rebind_deadline"] = "600"  # the same post with a deadline the rules allow
    saved = operator.post(url, data)
    assert saved.status_code == 302, (
        saved.context["adminform"].form.errors or saved.context["inline_admin_formsets"]
    )
    assert Agent.objects.get(pk=agent.pk).push_rebind_deadline == 600
