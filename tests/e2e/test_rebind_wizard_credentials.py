"""The rebind wizard's replacement of one config's token and credentials, and its list of
pre-checks, in a real browser (Debian's chromium through Playwright, against the ASGI app as
tests/e2e/test_rebind_console.py): the secrets are typed into password inputs, carried to
the confirmation sealed (never in the page), and end up in the config's new binding version;
each pre-check is a row with its result, and a failed one leaves no Start button. A
full-page screenshot of each step is saved in the `artifacts` directory.

DNS is the edge we do not own: host names resolve to a public address here; IP literals are
checked as they are (the live server runs in this process)."""

from __future__ import annotations

import secrets

import pytest
from django.contrib.auth import get_user_model

from a2a_platform.lib import crypto
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.e2e.test_admin import PASSWORD, log_in, page  # noqa: F401 (the page fixture)
from tests.e2e.test_admin_deliveries import orm
from tests.factories import AgentFactory
from tests.protocol_push import live_open_task
from webhooks.delivery import ssrf
from webhooks.models import PushBinding, Rebind
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.operations import rebind_start

URL = "https://client.example.org/hooks/v1/task-0"


@pytest.fixture
def wizard_data(transactional_db, monkeypatch, asgi_server):
    """A WORKING task opened through the server the browser uses, its config (with a token)
    inline, as a client opens it (the binding's issuer is that server's URL)."""
    monkeypatch.setattr(ssrf, "resolve", lambda host, port: ["93.184.216.34"])
    get_user_model().objects.create_superuser("admin", email="", password=PASSWORD)
    agent = AgentFactory(slug="shop-bot", executor="external")
    push = {"id": "cfg-0", "url": URL, "token": "old-token-0"}
    task = Task.objects.get(pk=live_open_task(asgi_server.url, agent, push=push))
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    return agent, task


def checks_table(page) -> dict[str, tuple[str, str]]:  # noqa: F811
    """The confirmation page's checks: check → (result, why)."""
    rows = {}
    for row in page.locator("#rebind-checks tbody tr").all():
        cells = row.locator("td").all_inner_texts()
        rows[cells[0]] = (cells[1], cells[2])
    return rows


def fill_config(page, task_id: str) -> None:  # noqa: F811
    page.goto("/admin/webhooks/rebind/start/")
    page.select_option("#id_agent", "shop-bot")
    page.check("input[name=operations][value=config]")
    page.fill("#id_task_id", task_id)
    page.fill("#id_config_id", "cfg-0")


def test_rebind_wizard_replaces_only_the_token_and_credentials_never_showing_them(
    wizard_data,
    page,  # noqa: F811
    artifacts,
):
    _, task = wizard_data
    new_token = f"tok-{secrets.token_urlsafe(12)}"
    new_credentials = f"cred-{secrets.token_urlsafe(12)}"
    log_in(page)
    fill_config(page, str(task.pk))
    page.select_option("#id_policy", "cutover")
    page.fill("#id_new_token", new_token)
    page.fill("#id_new_credentials", new_credentials)  # no scheme: refused on its field
    page.click("input[name=preview]")
    error = page.locator(".form-row.errors:has(#id_new_auth_scheme) .errorlist").inner_text()
    assert "is required with credentials" in error
    assert page.input_value("#id_new_token") == ""  # a password input: never rendered back
    assert page.get_attribute("#id_new_token", "type") == "password"
    assert new_token not in page.content()
    assert new_credentials not in page.content()
    page.screenshot(path=str(artifacts / "wizard-credentials-refused.png"), full_page=True)

    page.fill("#id_new_token", new_token)
    page.fill("#id_new_auth_scheme", "Bearer")
    page.fill("#id_new_credentials", new_credentials)
    page.screenshot(path=str(artifacts / "wizard-credentials-start.png"), full_page=True)
    page.click("input[name=preview]")

    page.wait_for_selector("#rebind-checks")
    html = page.content()
    assert new_token not in html
    assert new_credentials not in html
    config_line = page.locator("#rebind-config").inner_text()
    assert "new token: set" in config_line
    assert "credentials: replaced (Bearer)" in config_line
    assert checks_table(page) == {
        "SSRF policy of the new URLs": ("not needed", "no new URL: every config keeps its own"),
        "key published (the new key in the JWKS before it signs)": (
            "not needed",
            "no key rotation: the signing keys stay as they are",
        ),
        "a rebind already open on this scope": ("passed", "No open rebind over this scope"),
    }
    assert not orm(Rebind.objects.exists)  # nothing written before the confirmation
    page.screenshot(path=str(artifacts / "wizard-credentials-confirm.png"), full_page=True)
    page.click("#rebind-confirm")

    page.wait_for_selector("#rebind-console")  # the rebind's page
    assert "/change/" in page.url
    assert new_token not in page.content()
    assert new_credentials not in page.content()
    page.screenshot(path=str(artifacts / "wizard-credentials-rebind.png"), full_page=True)

    rebind, bindings = orm(
        lambda: (
            Rebind.objects.select_related("config").get(),
            list(PushBinding.objects.filter(config__task=task).order_by("version")),
        )
    )
    assert (rebind.state, rebind.policy, rebind.config.config_id) == (
        "cut_over",
        "cutover",
        "cfg-0",
    )
    assert [b.version for b in bindings] == [1, 2]
    old, new = bindings
    assert old.retired_at is not None
    assert new.retired_at is None
    assert new.url == old.url == URL  # credentials only: the URL stays
    assert crypto.decrypt(old.token_encrypted) == "old-token-0"
    assert crypto.decrypt(new.token_encrypted) == new_token
    assert (new.auth_scheme, crypto.decrypt(new.credentials_encrypted)) == (
        "Bearer",
        new_credentials,
    )


def test_rebind_wizard_lists_each_check_with_its_result_and_refuses_a_failed_one(
    wizard_data,
    page,  # noqa: F811
    artifacts,
):
    agent, task = wizard_data
    log_in(page)
    # A rotation with a new URL the SSRF policy refuses (a private address over plain http).
    fill_config(page, str(task.pk))
    page.check("input[name=operations][value=rotate_key]")
    page.fill("#id_new_url", "http://10.1.2.3/")
    page.click("input[name=preview]")

    page.wait_for_selector("#rebind-checks")
    checks = checks_table(page)
    result, why = checks["SSRF policy of the new URLs"]
    assert result == "failed"
    assert why.startswith("http://10.1.2.3/: ")
    key_result, key_why = checks["key published (the new key in the JWKS before it signs)"]
    assert key_result == "passed"
    assert orm(lambda: agent.signing_keys.get(state="active").kid) in key_why
    assert checks["a rebind already open on this scope"][0] == "passed"
    assert page.locator("#rebind-confirm").count() == 0
    assert "Refused: a check failed" in page.locator("#rebind-refused").inner_text()
    assert page.locator("#rebind-checks tr.check-failed").count() == 1
    page.screenshot(path=str(artifacts / "wizard-checks-ssrf-failed.png"), full_page=True)

    # The same request posted as confirmed anyway: refused on the form, nothing written.
    page.evaluate("() => document.querySelector('#content form').submit()")
    page.wait_for_selector("#rebind-form")
    assert "new_url: http://10.1.2.3/" in page.locator(".errorlist").first.inner_text()
    assert not orm(Rebind.objects.exists)

    # An open rebind over that config: the conflict is a failed row, then forced over.
    moved = URL.replace("/v1/", "/v3/")
    orm(
        lambda: rebind_start(
            RebindRequest(agent=agent, config=task.push_configs.get(), new_url=moved), actor="ops"
        )
    )
    fill_config(page, str(task.pk))
    page.fill("#id_new_token", "another-token")
    page.click("input[name=preview]")
    page.wait_for_selector("#rebind-checks")
    result, why = checks_table(page)["a rebind already open on this scope"]
    assert result == "failed"
    assert "is still open over the same scope" in why
    assert page.locator("#rebind-confirm").count() == 0
    assert "another-token" not in page.content()
    page.screenshot(path=str(artifacts / "wizard-checks-conflict.png"), full_page=True)
    fill_config(page, str(task.pk))
    page.fill("#id_new_token", "another-token")
    page.check("#id_force")
    page.click("input[name=preview]")
    page.wait_for_selector("#rebind-checks")
    result, why = checks_table(page)["a rebind already open on this scope"]
    assert result == "forced"
    assert why.endswith("(forced over it)")
    assert page.locator("#rebind-confirm").count() == 1
    page.screenshot(path=str(artifacts / "wizard-checks-forced.png"), full_page=True)
