"""The rebind wizard's form (webhooks/rebinds/forms.py RebindForm) through the admin, in process:
a config's new token and credentials validated by field, never rendered back, carried to
the confirmation sealed (a tampered or expired seal is refused on the token's field), and the
removal of both; the preview's checks (webhooks/rebinds/checks.py) with their results.
Browser tests of the same: tests/e2e/test_rebind_wizard_credentials.py."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from a2a_platform.lib import crypto
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.factories import AgentFactory
from tests.protocol_push import open_task
from webhooks.errors import RebindInvalid
from webhooks.models import PushBinding, PushConfig, Rebind
from webhooks.rebinds.checks import RebindRequest, rebind_preview
from webhooks.rebinds.forms import SEALED_MAX_AGE_SECONDS

# Transactional: the config is made through the protocol app, whose ORM calls run on other
# threads (tests/protocol_push.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("public_dns")]

URL = "https://client.example.org/hooks/v1/task-0"
START = "/admin/webhooks/rebind/start/"
SECRET = "tok-never-shown-7f3a"
CREDENTIALS = "cred-never-shown-91bc"


@pytest.fixture
def config():
    """A WORKING task's config with a token and credentials, registered through the protocol
    (SendMessage with it inline), as a client registers it."""
    agent = AgentFactory(slug="hooks", executor="external")
    push = {
        "id": "cfg-0",
        "url": URL,
        "token": "old-token",
        "authentication": {"scheme": "Basic", "credentials": "old-credentials"},
    }
    task = Task.objects.get(pk=open_task(agent, push=push))
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    return PushConfig.objects.get(task=task)


def _post(client, config, **fields):
    data = {
        "agent": "hooks",
        "operations": ["config"],
        "task_id": str(config.task_id),
        "config_id": "cfg-0",
        "policy": "cutover",
        **fields,
    }
    return client.post(START, data)


def _errors(page: str) -> list[str]:
    found = re.findall(r'<ul class="errorlist[^"]*"[^>]*>\s*<li>(.*?)</li>', page)
    return [html.unescape(error) for error in found]


def _sealed(page: str) -> str:
    match = re.search(r'name="sealed_secrets" value="([^"]+)"', page)
    assert match, "no sealed secrets on the page"
    return match.group(1)


def _current(config) -> PushBinding:
    return PushBinding.objects.get(config=config, retired_at__isnull=True)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"new_credentials": "c"}, "is required with credentials"),
        ({"new_auth_scheme": "Bad Scheme"}, "must be an HTTP auth scheme name"),
        ({"new_token": "line\nbreak"}, "must be printable ASCII"),
        ({"new_token": "t", "remove_credentials": "on"}, "leave it empty to remove"),
        ({}, "give the config's new URL, token or credentials"),
    ],
)
def test_bad_secrets_are_refused_on_their_field_and_never_rendered(
    admin_client, config, fields, message
):
    page = _post(admin_client, config, **fields).content.decode()
    assert "Start a rebind" in page
    assert any(message in error for error in _errors(page)), _errors(page)
    for name in ("new_token", "new_credentials"):  # password inputs, never filled back
        (tag,) = re.findall(rf'<input[^>]*name="{name}"[^>]*>', page)
        assert 'type="password"' in tag
        assert "value=" not in tag
    assert not Rebind.objects.exists()


def test_secrets_without_the_config_operation_are_refused(admin_client, config):
    page = admin_client.post(
        START, {"agent": "hooks", "operations": ["rotate_key"], "new_token": SECRET}
    ).content.decode()
    # The pre-check's refusal (the form only parses), on the URL's field.
    assert "new_url: replaces one config&#x27;s URL or credentials: name the config" in page
    assert SECRET not in page


def test_the_confirmation_carries_the_secrets_sealed_then_they_reach_the_new_binding(
    admin_client, config
):
    secrets = {"new_token": SECRET, "new_auth_scheme": "Bearer", "new_credentials": CREDENTIALS}
    page = _post(admin_client, config, **secrets).content.decode()
    assert "Confirm the rebind" in page
    assert SECRET not in page
    assert CREDENTIALS not in page
    assert "new token: set; credentials: replaced (Bearer)" in page
    sealed = _sealed(page)
    assert SECRET in crypto.decrypt(sealed)  # readable only with the server's key
    assert not Rebind.objects.exists()
    started = _post(
        admin_client, config, new_auth_scheme="Bearer", sealed_secrets=sealed, confirm="yes"
    )
    assert started.status_code == 302, started.content.decode()[:2000]
    binding = _current(config)
    assert binding.version == 2
    assert crypto.decrypt(binding.token_encrypted) == SECRET
    assert (binding.auth_scheme, crypto.decrypt(binding.credentials_encrypted)) == (
        "Bearer",
        CREDENTIALS,
    )
    assert binding.url == URL


def test_a_tampered_or_expired_seal_is_refused_and_starts_nothing(admin_client, config):
    page = _post(admin_client, config, new_token=SECRET).content.decode()
    sealed = _sealed(page)
    tampered = sealed[:-8] + ("A" if sealed[-8] != "A" else "B") + sealed[-7:]
    answer = _post(admin_client, config, sealed_secrets=tampered, confirm="yes")
    assert "unreadable: type them again" in answer.content.decode()
    with time_machine.travel(timezone.now() + timedelta(seconds=SEALED_MAX_AGE_SECONDS + 60)):
        answer = _post(admin_client, config, sealed_secrets=sealed, confirm="yes")
    assert "expired: type them again" in answer.content.decode()
    assert not Rebind.objects.exists()
    assert _current(config).version == 1


def test_remove_credentials_leaves_the_new_binding_without_token_or_credentials(
    admin_client, config
):
    page = _post(admin_client, config, remove_credentials="on").content.decode()
    assert "token: removed; credentials: removed" in page
    started = _post(admin_client, config, remove_credentials="on", confirm="yes")
    assert started.status_code == 302
    binding = _current(config)
    assert (binding.version, binding.token_encrypted, binding.auth_scheme) == (2, "", "")
    assert binding.credentials_encrypted == ""


def test_the_preview_lists_each_check_and_the_api_mode_still_refuses_an_unsafe_url(config):
    agent = config.task.agent
    request = RebindRequest(
        agent=agent, rotate_key=True, config=config, new_url="http://10.1.2.3/hook"
    )
    with pytest.raises(RebindInvalid, match="10.1.2.3") as refused:
        rebind_preview(request)
    assert refused.value.field == "new_url"
    preview = rebind_preview(
        RebindRequest(
            agent=agent,
            rotate_key=True,
            config=config,
            new_url="http://10.1.2.3/hook",
            preview_refuses_unsafe=False,
        )
    )
    results = {check.check: check.result for check in preview.checks}
    assert results == {
        "SSRF policy of the new URLs": "failed",
        "key published (the new key in the JWKS before it signs)": "passed",
        "a rebind already open on this scope": "passed",
    }
    assert not preview.startable
    fine = rebind_preview(RebindRequest(agent=agent, config=config, new_url=URL + "-v2"))
    assert [c.result for c in fine.checks] == ["passed", "not needed", "passed"]
    assert fine.startable
