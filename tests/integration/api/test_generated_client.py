"""A client generated from the served schema (openapi-python-client, as an integration team
makes one) imports whole and drives the everyday flows through its own calls only: agents,
their keys, tasks with filters and cursor pages, deliveries, endpoints, a rebind from
preview to abort, and the documented errors. Each answer is checked against the rows the
API wrote; the tasks are opened as clients open them (SendMessage to the live process)."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from agents.models import Agent, ApiKey
from tasks.models import Task
from tests.api_tokens import OPERATOR_PERMS, token_for, user_with
from tests.factories import AgentFactory
from tests.processes import BIN
from tests.protocol_push import live_open_task
from webhooks.models import Delivery, Endpoint, PushConfig, Rebind, RebindState

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_receivers")]

PACKAGE = "a2a_platform_client"
V1 = "http://127.0.0.1:9/hooks/v1/"
V2 = "http://127.0.0.1:9/hooks/v2/"


@pytest.fixture(scope="module")
def generated(_api_web, tmp_path_factory) -> Iterator[ModuleType]:
    """The client package generated from the live process's /api/schema/, importable."""
    import httpx

    out = tmp_path_factory.mktemp("generated-client")
    schema = out / "openapi.json"
    answer = httpx.get(f"{_api_web.url}/api/schema/", params={"format": "json"}, timeout=30)
    assert answer.status_code == 200, answer.text
    schema.write_bytes(answer.content)
    config = out / "config.yaml"
    # No post hooks: the generator formats its output with ruff when asked, not needed here.
    config.write_text(f"post_hooks: []\npackage_name_override: {PACKAGE}\n")
    run = subprocess.run(
        [
            str(BIN / "openapi-python-client"),
            "generate",
            "--path",
            str(schema),
            "--meta",
            "none",
            "--output-path",
            str(out / PACKAGE),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    # The generator reports what it could not generate as warnings: none may be left.
    assert "Warning" not in run.stdout + run.stderr, run.stdout + run.stderr
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def _mod(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_every_generated_module_imports(generated):
    names = [m.name for m in pkgutil.walk_packages(generated.__path__, f"{PACKAGE}.")]
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 (each failure is reported by module)
            failed[name] = repr(exc)
    assert failed == {}
    # One module per operation of the schema, each of them there.
    assert len([n for n in names if n.startswith(f"{PACKAGE}.api.")]) > 45


def _client(generated, api_web, scope: str, name: str):
    """A client with a token of `scope` whose user holds every operator permission."""
    user = user_with(f"{name}-user", *OPERATOR_PERMS)
    return generated.AuthenticatedClient(
        base_url=api_web.url, token=token_for(user, scope, name=name), timeout=30
    )


def _cursor(next_url: str | None) -> str | None:
    return parse_qs(urlsplit(next_url).query)["cursor"][0] if next_url else None


def test_everyday_flows_through_the_generated_client(generated, api_web):
    m = _mod("models")
    agents = _mod("api.agents")
    for op in (
        "agents_create",
        "agents_retrieve",
        "agents_partial_update",
        "agents_keys_create",
        "agents_keys_revoke_create",
    ):
        importlib.import_module(f"{agents.__name__}.{op}")
    client = _client(generated, api_web, "rebind", "gen-rebinder")

    # --- an agent: created with every switch on, lists and nested skills kept as sent
    skill = m.AgentCreateRequestSkillsItem(
        id="bill", name="Billing", description="answers billing questions", tags=["billing"]
    )
    created = agents.agents_create.sync_detailed(
        client=client,
        body=m.AgentCreateRequest(
            slug="gen-billing",
            name="Billing",
            description="Answers billing questions",
            skills=[skill],
            default_input_modes=["text/plain"],
            push_notifications_enabled=True,
            streaming_enabled=True,
            enabled=True,
            executor="external",
        ),
        idempotency_key="gen-create-billing",
    )
    assert created.status_code == 201, created.content
    agent = Agent.objects.get(slug="gen-billing")
    assert (agent.enabled, agent.push_notifications_enabled, agent.streaming_enabled) == (
        True,
        True,
        True,
    )
    assert agent.skills == [skill.to_dict()]
    assert agent.default_input_modes == ["text/plain"]
    patched = agents.agents_partial_update.sync_detailed(
        "gen-billing",
        client=client,
        body=m.PatchedAgentWriteRequest(default_input_modes=[], streaming_enabled=False),
    )
    assert patched.status_code == 200, patched.content
    agent.refresh_from_db()
    assert (agent.default_input_modes, agent.streaming_enabled) == ([], False)
    read = agents.agents_retrieve.sync("gen-billing", client=client)
    assert isinstance(read, m.Agent)
    assert read.capabilities.streaming.on is False
    assert read.capabilities.streaming.reason == "switched off by an operator"

    # --- an A2A key: the secret once, then revoked
    key = agents.agents_keys_create.sync(
        "gen-billing",
        client=client,
        body=m.ApiKeyCreateRequest(name="backend", kind=m.ApiKeyKind.WORKER),
    )
    assert isinstance(key, m.NewApiKey), key
    stored = ApiKey.objects.get(pk=key.id)
    assert (stored.agent_id, stored.kind, stored.prefix) == (agent.pk, "worker", key.prefix)
    assert key.secret.startswith("a2a_")
    revoked = agents.agents_keys_revoke_create.sync("gen-billing", key.id, client=client)
    assert isinstance(revoked, m.ApiKey)
    stored.refresh_from_db()
    assert stored.revoked_at is not None

    # --- tasks opened by clients (SendMessage), listed by filter in cursor pages
    hosted = AgentFactory(slug="gen-hooks", executor="external")
    opened = {
        live_open_task(api_web.url, hosted, push={"id": f"c{i}", "url": f"{V1}t{i}"})
        for i in range(3)
    }
    tasks_list = importlib.import_module(f"{PACKAGE}.api.tasks.tasks_list")
    seen, cursor = [], None
    while True:
        page = tasks_list.sync(
            client=client,
            agent="gen-hooks",
            state=m.TasksListState.SUBMITTED,
            ordering=[m.TasksListOrderingItem.CREATEDAT],
            page_size=2,
            cursor=cursor,
        )
        assert isinstance(page, m.PaginatedTaskList), page
        seen += [str(t.id) for t in page.results]
        cursor = _cursor(page.next_)
        if cursor is None:
            break
    expected = Task.objects.filter(agent=hosted).order_by("created_at", "id")
    assert seen == [str(t.pk) for t in expected]
    assert set(seen) == opened

    # --- deliveries: each task's snapshot, as stored
    deliveries_list = importlib.import_module(f"{PACKAGE}.api.deliveries.deliveries_list")
    listed = deliveries_list.sync(client=client, agent="gen-hooks")
    assert {str(d.id) for d in listed.results} == {
        str(e)
        for e in Delivery.objects.filter(task__agent=hosted).values_list("event_id", flat=True)
    }

    # --- endpoints: paused and resumed
    endpoint = Endpoint.objects.get(origin="http://127.0.0.1:9")
    pause = importlib.import_module(f"{PACKAGE}.api.endpoints.endpoints_pause_create")
    resume = importlib.import_module(f"{PACKAGE}.api.endpoints.endpoints_resume_create")
    paused = pause.sync(endpoint.pk, client=client, body=m.PauseRequest(reason="maintenance"))
    assert paused.health.paused is True
    endpoint.refresh_from_db()
    assert endpoint.paused_reason == "maintenance"
    assert resume.sync(endpoint.pk, client=client).health.paused is False

    # --- a rebind: previewed (nothing written), started, aborted
    rebinds_create = importlib.import_module(f"{PACKAGE}.api.rebinds.rebinds_create")
    abort = importlib.import_module(f"{PACKAGE}.api.rebinds.rebinds_abort_create")
    move = m.MovePrefixRequest(old=V1, new=V2)
    preview = rebinds_create.sync(
        client=client, body=m.StartRequest(agent="gen-hooks", move_prefix=move, preview=True)
    )
    assert isinstance(preview, m.Preview), preview
    assert preview.configs == PushConfig.objects.filter(task__agent=hosted).count() == 3
    assert not Rebind.objects.exists()
    started = rebinds_create.sync(
        client=client,
        body=m.StartRequest(agent="gen-hooks", move_prefix=move, reason="to v2"),
        idempotency_key="gen-rebind-1",
    )
    assert isinstance(started, m.Rebind), started
    assert Rebind.objects.get(pk=started.id).move_to == V2
    aborted = abort.sync(started.id, client=client, body=m.AbortRequest(reason="not today"))
    assert isinstance(aborted, m.Rebind)
    assert Rebind.objects.get(pk=started.id).state == RebindState.ABORTED

    # --- the dashboard, typed: every agent with its capabilities
    dashboard = importlib.import_module(f"{PACKAGE}.api.dashboard.dashboard_retrieve")
    figures = dashboard.sync(client=client)
    assert isinstance(figures, m.Dashboard), figures
    assert [a.slug for a in figures.agents] == sorted(Agent.objects.values_list("slug", flat=True))
    assert {a.slug: a.capabilities.streaming.on for a in figures.agents}["gen-billing"] is False
    # Its sections are typed too: readiness as /readyz answers it, each check a model.
    assert isinstance(figures.readiness, m.Readiness)
    readyz = httpx.get(f"{api_web.url}/readyz", timeout=10).json()
    assert figures.readiness.ready is (readyz["status"] == "ready")
    checks = {c.name: c.ok for c in figures.readiness.checks}
    assert all(isinstance(c, m.Check) for c in figures.readiness.checks)
    assert {k: checks[k] for k in readyz["checks"]} == {
        k: c["ok"] for k, c in readyz["checks"].items()
    }
    assert all(isinstance(w, m.WebInstance) for w in figures.readiness.web_instances)

    # --- documented errors, each as the Error model
    reused = agents.agents_create.sync_detailed(
        client=client,
        body=m.AgentCreateRequest(slug="gen-other", name="Other", description="another body"),
        idempotency_key="gen-create-billing",
    )
    assert reused.status_code == 422
    assert reused.parsed.error.code == "idempotency_key_reused"
    assert not Agent.objects.filter(slug="gen-other").exists()
    stranger = generated.AuthenticatedClient(base_url=api_web.url, token="a2apt_nope_nope")
    unknown = agents.agents_retrieve.sync_detailed("gen-billing", client=stranger)
    assert unknown.status_code == 401
    assert unknown.parsed.error.code == "authentication_failed"
    missing = agents.agents_retrieve.sync_detailed("no-such-agent", client=client)
    assert missing.status_code == 404
    assert missing.parsed.error.code == "not_found"
    reader = _client(generated, api_web, "read", "gen-reader")
    denied = agents.agents_create.sync_detailed(
        client=reader, body=m.AgentCreateRequest(slug="gen-x", name="X", description="x")
    )
    assert denied.status_code == 403
    assert denied.parsed.error.code == "permission_denied"
    assert "agents.add_agent" in denied.parsed.error.message
    assert not Agent.objects.filter(slug="gen-x").exists()
    refused = rebinds_create.sync_detailed(
        client=client,
        body=m.StartRequest(agent="gen-hooks", move_prefix=m.MovePrefixRequest(old=V1, new=V1)),
    )
    assert refused.status_code == 400
    assert refused.parsed.error.code == "invalid_request"
    assert Rebind.objects.count() == 1
