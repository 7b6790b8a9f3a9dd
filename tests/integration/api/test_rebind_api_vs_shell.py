"""The same rebind driven through the API (over HTTP, a live web process) and through the
shell (`manage.py rebind`, as the README documents it) on twin agents: start a drain that
moves a URL prefix, cut it over, re-bind the orphans. Each step leaves both twins in the same
state: the rebind rows, every config's binding versions, the moves and their notices, the
tasks' orphan marks, and the same audit rows in the same order (the actor aside)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from agents.models import OperatorAction
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.factories import AgentFactory
from tests.protocol_push import live_open_task
from webhooks.models import ChannelMove, Delivery, PushConfig, Rebind
from webhooks.selectors import binding_status

# The API's rebind checks its new URLs in the web process, which resolves names for real:
# loopback (allowed there and, by `loopback_receivers`, here); nothing needs to listen.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_receivers")]

V1 = "http://127.0.0.1:9/hooks/v1/"
V2 = "http://127.0.0.1:9/hooks/v2/"
URI = "urn:a2a-platform:ext:push-channel:v1"


def _twin(web, slug: str) -> None:
    """Three in-flight tasks and a finished one, each with a config under V1, and one task
    whose config is elsewhere (out of the rebind's scope): opened through the live web
    process (SendMessage with an inline push config), as a client opens them."""
    agent = AgentFactory(slug=slug, executor="external")
    for i in range(5):
        url = f"{V1}task-{i}" if i < 4 else f"http://127.0.0.2:9/elsewhere/task-{i}"
        task = Task.objects.get(
            pk=live_open_task(
                web.url, agent, push={"id": f"cfg-{i}", "url": url}, context_id=f"ctx-{i}"
            )
        )
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        if i == 3:
            services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)


def _orphaned_channels(task: Task) -> list[dict]:
    return (task.metadata.get(URI) or {}).get("orphanedChannels", [])


def _state(slug: str) -> dict[str, Any]:
    """Everything a rebind changes for one agent, named by what is the same across twins
    (contexts and config ids, not primary keys)."""
    rebind = Rebind.objects.get(agent__slug=slug)
    ctx = dict(Task.objects.filter(agent__slug=slug).values_list("pk", "context_id"))
    configs = PushConfig.objects.filter(task__agent__slug=slug).prefetch_related("bindings")
    versions = sorted(
        (ctx[c.task_id], c.config_id, b.version, binding_status(b), b.url)
        for c in configs
        for b in c.bindings.all()
    )
    moves = sorted(
        (
            ctx[m.task_id],
            m.config.config_id,
            m.old_binding.version,
            m.new_binding.version if m.new_binding_id else None,
            m.state,
            m.from_seq,
            m.notice.state if m.notice_id else None,
        )
        for m in ChannelMove.objects.filter(rebind=rebind).select_related(
            "config", "old_binding", "new_binding", "notice"
        )
    )
    deliveries = sorted(
        Delivery.objects.filter(task__agent__slug=slug).values_list(
            "task__context_id", "config__config_id", "binding__version", "seq", "kind", "state"
        )
    )
    orphaned = sorted(
        (
            ctx[t.pk],
            [c["configId"] for c in (t.metadata.get(URI) or {}).get("orphanedChannels", [])],
        )
        for t in Task.objects.filter(agent__slug=slug)
    )
    audit = [
        (action, {k: v for k, v in target.items() if k not in ("rebind", "agent")})
        for action, target in OperatorAction.objects.filter(target__agent=slug)
        .order_by("created_at", "id")
        .values_list("action", "target")
    ]
    for _, target in OperatorAction.objects.filter(target__agent=slug).values_list(
        "action", "target"
    ):
        assert target["rebind"] == str(rebind.pk)
    return {
        "rebind": (
            rebind.state,
            rebind.policy,
            rebind.move_from,
            rebind.move_to,
            rebind.reason,
            rebind.on_timeout,
            rebind.deadline_seconds,
            rebind.finish_on_old,
            rebind.forced,
            rebind.moves_planned,
        ),
        "counts": rebind.counts,
        "versions": versions,
        "moves": moves,
        "deliveries": deliveries,
        "orphaned": orphaned,
        "audit": audit,
    }


def _shell(*args: str) -> str:
    out = io.StringIO()
    call_command("rebind", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_the_api_and_the_shell_make_the_same_rebind_with_the_same_audit(api_web, tokens):
    _twin(api_web, "twin-api")
    _twin(api_web, "twin-shell")
    api = tokens.client("rebind", name="rebinder")

    started = api.post(
        "/api/v1/rebinds/",
        json={
            "agent": "twin-api",
            "movePrefix": {"old": V1, "new": V2},
            "policy": "drain",
            "deadlineSeconds": 3600,
            "reason": "move to v2",
        },
    )
    assert started.status_code == 201, started.text
    api_rebind = started.json()["id"]
    shell_rebind = _shell(
        "start",
        "twin-shell",
        "--move-prefix",
        V1,
        V2,
        "--policy",
        "drain",
        "--deadline",
        "1h",
        "--reason",
        "move to v2",
        "--actor",
        "shell-op",
    )
    assert Rebind.objects.get(pk=shell_rebind).agent.slug == "twin-shell"
    drained_api, drained_shell = _state("twin-api"), _state("twin-shell")
    assert drained_api == drained_shell
    assert drained_api["rebind"][0] == "draining"
    assert len(drained_api["moves"]) == 3  # the in-flight tasks under V1, no other

    cut = api.post(f"/api/v1/rebinds/{api_rebind}/cutover")
    assert cut.status_code == 200, cut.text
    _shell("cutover", shell_rebind, "--actor", "shell-op")
    cut_api, cut_shell = _state("twin-api"), _state("twin-shell")
    assert cut_api == cut_shell
    assert cut_api["rebind"][0] == "cut_over"
    assert {m[4] for m in cut_api["moves"]} == {"orphaned"}

    rebound = api.post(f"/api/v1/rebinds/{api_rebind}/rebind-orphans")
    assert rebound.status_code == 200, rebound.text
    assert rebound.json() == {"rebound": 3}
    _shell("rebind-orphans", shell_rebind, "--actor", "shell-op")
    final_api, final_shell = _state("twin-api"), _state("twin-shell")
    assert final_api == final_shell
    assert {m[4] for m in final_api["moves"]} == {"rebound"}
    assert all(configs == [] for _, configs in final_api["orphaned"])

    # The same actions, each by its caller: the API's as `api:<user>`, the shell's as named.
    actors = {
        slug: set(OperatorAction.objects.filter(target__agent=slug).values_list("actor", flat=True))
        for slug in ("twin-api", "twin-shell")
    }
    assert actors == {"twin-api": {"api:rebinder-user"}, "twin-shell": {"shell-op"}}
    assert [a for a, _ in final_api["audit"]] == [
        "rebind_start",
        "rebind_drain",
        "rebind_cut_over",
        "rebind_rebind_orphans",
    ]
