"""The operator commands, run as `manage.py` would run them (argument parsing included)."""

from __future__ import annotations

import hashlib
import re
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from agents.models import Agent, ApiKey, ApiKeyKind
from agents.services import api_key_authenticate, api_key_create, api_key_revoke
from tests.factories import AgentFactory

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


# --- create_agent ---------------------------------------------------------------------------


def test_create_agent_creates_it_with_the_given_options():
    out, _ = run(
        "create_agent",
        "my-agent",
        "--name",
        "My agent",
        "--description",
        "does things",
        "--executor",
        "external",
        "--auth",
        "api_key",
        "--agent-version",
        "2.1.0",
    )
    assert out.strip() == "created agent my-agent (executor external)"
    agent = Agent.objects.get(slug="my-agent")
    assert (agent.name, agent.description, agent.version) == ("My agent", "does things", "2.1.0")
    assert (agent.executor, agent.auth_mode, agent.is_default) == ("external", "api_key", False)
    assert agent.default_input_modes == ["text/plain"]


def test_create_agent_default_moves_the_root_role():
    old = AgentFactory(is_default=True)
    run("create_agent", "new-root", "--name", "N", "--description", "d", "--default")
    old.refresh_from_db()
    assert not old.is_default
    assert Agent.objects.get(slug="new-root").is_default


@pytest.mark.parametrize("slug", ["tasks", "admin", ".well-known", "Healthz"])
def test_create_agent_refuses_a_reserved_slug(slug):
    with pytest.raises(CommandError, match="is reserved"):
        run("create_agent", slug, "--name", "N", "--description", "d")
    assert not Agent.objects.exists()


@pytest.mark.parametrize("slug", ["Bad_Slug", "-leading", "trailing-", "has space", "x" * 65])
def test_create_agent_refuses_a_malformed_slug(slug):
    with pytest.raises(CommandError, match="slug"):
        run("create_agent", slug, "--name", "N", "--description", "d")
    assert not Agent.objects.exists()


def test_create_agent_refuses_a_taken_slug():
    AgentFactory(slug="taken", name="first")
    with pytest.raises(CommandError, match="slug"):
        run("create_agent", "taken", "--name", "second", "--description", "d")
    assert Agent.objects.get(slug="taken").name == "first"


def test_create_agent_accepts_a_hosted_executor():
    out, _ = run(
        "create_agent", "hosted", "--name", "N", "--description", "d",
        "--executor", "python:my_pkg.agents:CurrencyAgentExecutor",
    )  # fmt: skip
    assert out.strip() == (
        "created agent hosted (executor python:my_pkg.agents:CurrencyAgentExecutor)"
    )
    assert Agent.objects.get(slug="hosted").executor == "python:my_pkg.agents:CurrencyAgentExecutor"


@pytest.mark.parametrize(
    ("executor", "says"),
    [
        ("magic", "unknown executor 'magic'"),
        ("python:x", "python:<module>:<attribute>"),
        ("python:my-pkg:X", "'my-pkg' is not a module path"),
        ("python:pkg:class", "'class' is not a Python identifier"),
        ("python:pkg:" + "X" * 300, "at most 255 characters"),
    ],
)
def test_create_agent_refuses_a_bad_executor_saying_why(executor, says):
    with pytest.raises(CommandError, match=re.escape(f"executor: {says}")):
        run("create_agent", "x", "--name", "N", "--description", "d", "--executor", executor)
    assert not Agent.objects.exists()


# --- create_api_key -------------------------------------------------------------------------


def test_create_api_key_prints_the_token_once_and_stores_only_its_digest():
    agent = AgentFactory(slug="keyed")

    out, err = run("create_api_key", "keyed", "--name", "client X")

    token = out.strip()
    assert out == token + "\n"  # stdout is the token alone, ready for `$(...)`
    assert re.fullmatch(r"a2a_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", token)
    assert token not in err
    key = ApiKey.objects.get(agent=agent)
    assert (key.name, key.kind) == ("client X", ApiKeyKind.CLIENT)
    assert key.prefix == token.split("_")[1]
    assert key.prefix in err  # the operator is told which key it is, without the secret
    assert key.digest == hashlib.sha256(token.encode()).hexdigest()
    secret = token.split("_", 2)[2]
    stored = [str(v) for v in ApiKey.objects.filter(pk=key.pk).values().get().values()]
    assert not any(secret in value for value in stored)

    assert api_key_authenticate(token, kind=ApiKeyKind.CLIENT) == key
    assert api_key_authenticate(token, kind=ApiKeyKind.WORKER) is None
    assert (
        api_key_authenticate(token[:-1] + ("A" if token[-1] != "A" else "B"), kind="client") is None
    )


def test_create_api_key_tokens_all_authenticate():
    """Many tokens, so secrets with every character of the urlsafe alphabet show up."""
    AgentFactory(slug="many")
    tokens = [run("create_api_key", "many", "--name", f"k{i}")[0].strip() for i in range(24)]
    assert len(set(tokens)) == 24
    assert any(t.count("_") > 2 for t in tokens)
    for token in tokens:
        key = api_key_authenticate(token, kind=ApiKeyKind.CLIENT)
        assert key is not None, token
        assert key.prefix == token.split("_")[1]


def test_create_api_key_worker_kind_and_revocation():
    AgentFactory(slug="backend")
    token = run("create_api_key", "backend", "--name", "w", "--kind", "worker")[0].strip()
    key = api_key_authenticate(token, kind=ApiKeyKind.WORKER)
    assert key is not None
    assert key.kind == ApiKeyKind.WORKER
    api_key_revoke(key_id=key.pk, actor="test")
    assert api_key_authenticate(token, kind=ApiKeyKind.WORKER) is None


def test_create_api_key_refuses_an_unknown_agent_and_kind():
    AgentFactory(slug="real")
    with pytest.raises(CommandError, match="no agent with slug 'ghost'"):
        run("create_api_key", "ghost", "--name", "x")
    with pytest.raises(CommandError, match="invalid choice"):
        run("create_api_key", "real", "--name", "x", "--kind", "admin")
    assert not ApiKey.objects.exists()


# --- list_agents ----------------------------------------------------------------------------


def test_list_agents_shows_each_agent_with_its_live_key_count():
    root = AgentFactory(slug="b-root", name="Root", is_default=True)
    other = AgentFactory(slug="a-other", name="Other", executor="external", enabled=False)
    api_key_create(agent=root, name="one")
    api_key_create(agent=root, name="two", kind="worker")
    api_key_revoke(key_id=api_key_create(agent=root, name="gone").key.pk, actor="test")

    out, _ = run("list_agents")

    rows = [line.split() for line in out.strip().splitlines()]
    assert rows[0] == ["slug", "name", "executor", "auth", "default", "enabled", "keys"]
    assert rows[1] == [other.slug, "Other", "external", "public", "no", "0"]
    assert rows[2] == [root.slug, "Root", "echo", "public", "yes", "yes", "2"]
    # Columns line up: every row starts its columns at the header's offsets.
    header = out.splitlines()[0]
    assert out.splitlines()[2].index("echo") == header.index("executor")


def test_list_agents_with_no_agents_prints_the_header_only():
    out, _ = run("list_agents")
    assert out.split() == ["slug", "name", "executor", "auth", "default", "enabled", "keys"]


# --- seed_demo ------------------------------------------------------------------------------


def test_seed_demo_is_idempotent_and_a_password_set_later_resets_the_login(
    monkeypatch, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("A2A_ADMIN_USER", "boss")
    monkeypatch.setenv("A2A_ADMIN_PASSWORD", "correct horse battery")
    User = get_user_model()

    out, _ = run("seed_demo")

    demo = Agent.objects.get(slug="demo")
    assert (demo.executor, demo.auth_mode, demo.is_default) == ("scripted", "public", True)
    assert demo.skills[0]["id"] == "scripted-demo"
    admin = User.objects.get(username="boss")
    assert admin.is_superuser
    assert admin.is_staff
    assert admin.check_password("correct horse battery")
    assert "correct horse battery" not in out  # the password from the environment is not echoed
    assert not (tmp_path / "admin-login.txt").exists()  # nothing generated, nothing kept

    # A newcomer who missed the first password sets one and runs again: it is the login now.
    monkeypatch.setenv("A2A_ADMIN_PASSWORD", "another one")
    out, _ = run("seed_demo")

    assert "demo agent `demo` already exists" in out
    assert "password from A2A_ADMIN_PASSWORD" in out
    assert "another one" not in out
    assert list(Agent.objects.values_list("pk", flat=True)) == [demo.pk]
    assert list(User.objects.values_list("pk", flat=True)) == [admin.pk]
    admin.refresh_from_db()
    assert admin.check_password("another one")


def test_seed_demo_keeps_a_generated_password_findable(monkeypatch, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("A2A_ADMIN_USER", "admin")
    monkeypatch.delenv("A2A_ADMIN_PASSWORD", raising=False)

    out, _ = run("seed_demo")

    password = re.search(r"password (\S+) \(also in ", out).group(1)
    assert get_user_model().objects.get(username="admin").check_password(password)
    login_file = tmp_path / "admin-login.txt"
    assert login_file.read_text() == f"user: admin\npassword: {password}\n"
    assert login_file.stat().st_mode & 0o777 == 0o600
    assert "manage.py changepassword admin" in out

    out, _ = run("seed_demo")

    assert password not in out  # printed once; the file and the reset command are named
    assert "password unchanged" in out
    assert str(login_file) in out
    assert "manage.py changepassword admin" in out


def test_seed_demo_leaves_an_existing_default_agent_alone(monkeypatch):
    monkeypatch.setenv("A2A_ADMIN_PASSWORD", "pw")
    root = AgentFactory(slug="root", is_default=True)
    run("seed_demo")
    root.refresh_from_db()
    assert root.is_default
    assert not Agent.objects.get(slug="demo").is_default


# --- sync_schedules -------------------------------------------------------------------------


SWEEP = "sweep executor dispatches"


def test_sync_schedules_is_idempotent():
    out, _ = run("sync_schedules")

    sweep = PeriodicTask.objects.get(name=SWEEP)
    assert sweep.task == "tasks.sweep_dispatches"
    assert sweep.queue == "heartbeat"
    assert sweep.enabled
    assert sweep.interval.every == settings.A2A_SWEEP_INTERVAL_SECONDS
    assert sweep.interval.period == IntervalSchedule.SECONDS
    assert f"every {settings.A2A_SWEEP_INTERVAL_SECONDS}s" in out

    before_tasks = list(PeriodicTask.objects.values_list("pk", "name", "task", "interval_id"))
    before_intervals = IntervalSchedule.objects.count()
    run("sync_schedules")
    assert list(PeriodicTask.objects.values_list("pk", "name", "task", "interval_id")) == (
        before_tasks
    )
    assert IntervalSchedule.objects.count() == before_intervals


def test_sync_schedules_repairs_a_changed_schedule():
    run("sync_schedules")
    PeriodicTask.objects.filter(name=SWEEP).update(enabled=False, queue="elsewhere")

    with override_settings(A2A_SWEEP_INTERVAL_SECONDS=7):
        run("sync_schedules")

    sweep = PeriodicTask.objects.get(name=SWEEP)
    assert (sweep.enabled, sweep.queue, sweep.interval.every) == (True, "heartbeat", 7)
    assert PeriodicTask.objects.filter(name=SWEEP).count() == 1


def test_sync_schedules_names_registered_jobs():
    from a2a_platform.celery import app

    run("sync_schedules")
    app.loader.import_default_modules()  # what a worker does at start: autodiscover jobs.py
    for job in PeriodicTask.objects.exclude(name__startswith="celery.").values_list(
        "task", flat=True
    ):
        assert job in app.tasks, job
