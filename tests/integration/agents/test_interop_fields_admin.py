"""The interoperability switches of issue 18 are agent settings an operator sees and sets in
the agent admin's form (and the executor choice lists `conformance`)."""

from __future__ import annotations

import pytest

from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def test_the_agent_form_shows_the_switches(admin_client):
    agent = AgentFactory(slug="ops", executor="echo")
    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'name="anonymous_list_tasks"' in html
    assert 'name="strict_version_header"' in html
    assert '<datalist id="executor-suggestions">' in html
    assert '<option value="conformance">' in html
    assert '<option value="anonymous">' in html


def _posted(client, url: str) -> dict:
    """The change page's own values, as a browser posts them."""
    form = client.get(url).context["adminform"].form
    data = {}
    for name in form.fields:
        value = form[name].value()
        if value is True:
            data[name] = "on"
        elif value is not False and value is not None:
            data[name] = value
    for prefix in ("signing_keys", "api_keys", "card_versions"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    return data


@pytest.mark.parametrize(
    ("executor", "says"),
    [
        ("magic", "unknown executor"),
        ("python:x", "python:&lt;module&gt;:&lt;attribute&gt;"),
        ("python:my-pkg:X", "is not a module path"),
        ("python:pkg:1X", "is not a Python identifier"),
    ],
)
def test_the_agent_form_refuses_a_bad_executor_saying_why(admin_client, executor, says):
    agent = AgentFactory(slug="ops", executor="echo")
    url = f"/admin/agents/agent/{agent.pk}/change/"
    data = {**_posted(admin_client, url), "executor": executor}
    response = admin_client.post(url, data)
    assert response.status_code == 200  # the form again, not a redirect
    assert "executor" in response.context["adminform"].form.errors
    assert says in response.content.decode()
    agent.refresh_from_db()
    assert agent.executor == "echo"


def test_the_agent_form_saves_a_hosted_executor(admin_client):
    agent = AgentFactory(slug="ops", executor="echo")
    url = f"/admin/agents/agent/{agent.pk}/change/"
    hosted = "python:my_pkg.agents:CurrencyAgentExecutor"
    saved = admin_client.post(url, {**_posted(admin_client, url), "executor": hosted})
    assert saved.status_code == 302, saved.context["adminform"].form.errors
    agent.refresh_from_db()
    assert agent.executor == hosted


def test_the_agent_page_says_why_its_hosted_code_keeps_the_card_back(admin_client):
    agent = AgentFactory(slug="broken", executor="python:no_such_module:X")
    html = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/").content.decode()
    assert "hosted executor" in html
    assert "has reported loading it yet" in html


def test_the_agent_page_is_grouped_by_purpose_and_edits_every_field(admin_client):
    """Every field an operator may set is on the page, once, in a section named for its
    purpose (identity, switches, authentication, card, push channels and rebinds)."""
    from agents.services import EDITABLE_FIELDS

    agent = AgentFactory(slug="grouped", executor="echo")
    page = admin_client.get(f"/admin/agents/agent/{agent.pk}/change/")
    sections = {fs.name: list(fs) for fs in page.context["adminform"]}
    assert list(sections) == [
        "Identity",
        "Switches",
        "Authentication",
        "Card",
        "Push channels and rebinds",
        "Now",
    ]
    form = page.context["adminform"].form
    assert set(form.fields) == {"slug", *EDITABLE_FIELDS}
    named = [
        name
        for fs in page.context["adminform"]
        for line in fs
        for field in line
        for name in [field.field["name"] if isinstance(field.field, dict) else field.field.name]
    ]
    assert sorted(n for n in named if n in form.fields) == sorted(form.fields)
