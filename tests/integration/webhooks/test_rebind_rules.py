"""The rebinds' rules, each written once and called by every interface (issue 44, "one home
per rule"): what is still on the old version (`ChannelMove.objects.on_old()`) and what keeps a
drain open (`keeping_drain_open()`), an abort's reason (`checks.checked_abort_reason`, in
`rebind_abort`), one config of an agent's task (`selectors.agent_push_config`), and the wizard's
form that only parses and shows the pre-checks' own refusals.

Each test goes through every interface (the drain, the counts, the console's payload, the
dashboard, the API, the `rebind` command, the admin) and asks for the same answer, in the same
words where there are words: an interface that computes or words a rule itself fails here.
"""

from __future__ import annotations

import html
import io
import json
import re

import pytest
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.api_tokens import api_client
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory
from tests.protocol_push import task_with_push
from webhooks.console.dashboard import dashboard_data
from webhooks.delivery.transport import TransportResult
from webhooks.errors import RebindInvalid
from webhooks.models import ChannelMove, MoveState, PushConfig, Rebind, RebindState
from webhooks.rebinds.checks import RebindRequest, rebind_preview
from webhooks.rebinds.console import rebind_console
from webhooks.rebinds.forms import REFUSED_FIELD, RebindForm
from webhooks.rebinds.operations import (
    rebind_abort,
    rebind_advance,
    rebind_moves_finish_on_old,
    rebind_moves_now,
    rebind_start,
)
from webhooks.selectors import agent_push_config, rebind_counts, rebind_stragglers
from webhooks.services import push_config_delete

pytestmark = pytest.mark.usefixtures("public_dns")

V1 = "https://client.example.org/hooks/v1/"
V2 = "https://client.example.org/hooks/v2/"
OK = TransportResult(200, {}, "", 1.0, None, None)
REBINDS = "/admin/webhooks/rebind/"
NO_REASON = "say why the rebind is aborted (a reason is recorded)"


@pytest.fixture
def agent(transactional_db):
    return AgentFactory(slug="hooks", is_default=True, executor="external", signing_key=True)


def _deliver(task) -> None:
    """Everything due on the task's config, answered 200."""
    push = PushConfig.objects.get(task=task)
    while (claim := delivery_claim_head(config_pk=push.pk)) is not None:
        delivery_record(claim=claim, result=OK)


def _draining(agent, names: list[str]) -> tuple[Rebind, dict[str, object]]:
    tasks = {}
    for i, name in enumerate(names):
        task = task_with_push(agent, f"{V1}{name}", config_id=f"cfg-{i}")
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        _deliver(task)  # its snapshot: what is left on the old version is the rebind's
        tasks[name] = task
    rebind = rebind_start(
        RebindRequest(agent=agent, move_from=V1, move_to=V2, deadline_seconds=3600), actor="ops"
    )
    assert rebind.state == RebindState.DRAINING, rebind.reason
    return rebind, tasks


# --- on the old version, and what keeps a drain open -------------------------------------------


@pytest.fixture
def scene(agent):
    """One drain with a move in each case the rule decides: waiting for its notice (in flight,
    and finished with its notice still open: the case the console and the drain once
    disagreed on), moved, its config deleted, finishing on old (in flight, and finished)."""
    names = ["waiting", "finished_waiting", "moved", "deleted", "finishing", "finished_finishing"]
    rebind, tasks = _draining(agent, names)
    _deliver(tasks["moved"])  # its notice delivered: moved
    moves = {n: ChannelMove.objects.get(rebind=rebind, task=t) for n, t in tasks.items()}
    changed = rebind_moves_finish_on_old(
        rebind.pk,
        move_pks=[moves["finishing"].pk, moves["finished_finishing"].pk],
        actor="ops",
    )
    assert changed == 2
    for name in ("finished_waiting", "finished_finishing"):
        services.task_transition(task_id=tasks[name].pk, to_state=TaskState.COMPLETED)
    push_config_delete(task=tasks["deleted"], config_id="cfg-3")
    states = {name: ChannelMove.objects.get(pk=move.pk).state for name, move in moves.items()}
    assert states == {
        "waiting": MoveState.NOTICE_PENDING,
        "finished_waiting": MoveState.NOTICE_PENDING,
        "moved": MoveState.MOVED,
        "deleted": MoveState.CONFIG_DELETED,
        "finishing": MoveState.FINISHING_ON_OLD,
        "finished_finishing": MoveState.FINISHING_ON_OLD,
    }
    on_old = {str(tasks[n].pk) for n in ("waiting", "finished_waiting", "finishing")}
    return rebind, tasks, on_old


def _tasks(moves) -> set[str]:
    return {str(t) for t in moves.values_list("task_id", flat=True)}


def test_on_old_is_what_keeps_the_drain_open(scene):
    rebind, tasks, on_old = scene
    moves = ChannelMove.objects.filter(rebind=rebind)
    assert _tasks(moves.on_old()) == on_old
    assert _tasks(moves.keeping_drain_open()) == on_old
    # The drain stays open for exactly those: the finished task's notice still open keeps it
    # (its last events are held for the new version until the notice is delivered).
    assert rebind_advance(rebind.pk).state == RebindState.DRAINING
    _deliver(tasks["waiting"])
    services.task_transition(task_id=tasks["finishing"].pk, to_state=TaskState.COMPLETED)
    assert _tasks(moves.keeping_drain_open()) == {str(tasks["finished_waiting"].pk)}
    assert rebind_advance(rebind.pk).state == RebindState.DRAINING
    _deliver(tasks["finished_waiting"])
    assert not moves.keeping_drain_open().exists()
    assert rebind_advance(rebind.pk).state == RebindState.COMPLETED


def test_every_interface_counts_the_same_tasks_on_old(scene):
    rebind, _, on_old = scene
    n = len(on_old)
    counts = rebind_counts(rebind)
    assert counts["onOldVersionTotal"] == n
    assert sum(counts["onOldVersion"].values()) == n
    assert {s["task"] for s in rebind_stragglers(rebind)} == on_old
    page = rebind_console(rebind)  # the console's page and its live view
    assert {row["task"] for row in page["onOld"]} == on_old
    assert (page["onOldTotal"], page["progress"]["left"]) == (n, n)
    [row] = dashboard_data(sections=frozenset({"rebinds"}))["rebinds"]
    assert row["onOldVersion"] == n
    api = api_client("reader", "view_rebind", scope="read")
    detail = api.get(f"/api/v1/rebinds/{rebind.pk}").json()
    assert {s["task"] for s in detail["onOldVersion"]} == on_old
    out = io.StringIO()
    call_command("rebind", "show", str(rebind.pk), "--json", stdout=out)
    assert {s["task"] for s in json.loads(out.getvalue())["onOldVersion"]} == on_old


def test_the_rebind_lists_on_old_count_links_to_exactly_those_moves(scene, superuser):
    """The rebinds list's "on old version" count and the moves list it links to, which filters
    by the same rule (a link by states alone would also list the finished task finishing on
    old, and the deleted config's move if its state matched)."""
    rebind, tasks, on_old = scene
    page = superuser.get(REBINDS).content.decode()
    link = re.search(r'href="([^"]*channelmove/\?rebind__id__exact=[^"]*)">(\d+)</a>', page)
    assert link is not None, "the rebinds list links its on-old count to the moves"
    assert int(link.group(2)) == len(on_old)
    listed = superuser.get(html.unescape(link.group(1)))
    assert listed.status_code == 200
    shown = {str(move.task_id) for move in listed.context["cl"].result_list}
    assert shown == on_old


def test_move_now_acts_only_on_what_is_on_old(scene):
    """The service decides on the moves the console lists, whoever passes the ids (the API
    takes any): a finished task finishing on old is not on it, so it is left alone."""
    rebind, tasks, on_old = scene
    moves = ChannelMove.objects.filter(rebind=rebind)
    every = list(moves.values_list("pk", flat=True))
    assert rebind_moves_now(rebind.pk, move_pks=every, actor="ops") == len(on_old)
    assert moves.get(task=tasks["finished_finishing"]).state == MoveState.FINISHING_ON_OLD
    assert moves.get(task=tasks["waiting"]).state == MoveState.MOVED


# --- an abort needs a reason, whoever asks ------------------------------------------------------


def _messages(answer) -> str:
    return " ".join(str(m) for m in get_messages(answer.wsgi_request))


def _abort_console(client, rebind) -> str:
    """The rebind's page: its abort asks the reason before the confirmation."""
    return _messages(
        client.post(f"{REBINDS}{rebind.pk}/do/abort/", {"reason": "  ", "confirm": "yes"})
    )


def _abort_changelist(client, rebind) -> str:
    """The rebinds' list: its "Abort" action with the reason field beside it left empty."""
    return _messages(
        client.post(
            REBINDS, {"action": "abort", "_selected_action": [str(rebind.pk)], "reason": ""}
        )
    )


def _abort_command(client, rebind) -> str:
    with pytest.raises(CommandError) as refused:
        call_command("rebind", "abort", str(rebind.pk), stdout=io.StringIO())
    assert refused.value.returncode == 2
    return str(refused.value)


def _abort_api(client, rebind) -> str:
    api = api_client("runner", "view_rebind", "run_rebind")
    answer = api.post(f"/api/v1/rebinds/{rebind.pk}/abort", {"reason": ""}, format="json")
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_request", "reason")
    assert error["fields"] == {"reason": [NO_REASON]}
    return error["message"]


@pytest.mark.parametrize(
    "interface", [_abort_console, _abort_changelist, _abort_command, _abort_api]
)
def test_every_interface_refuses_an_abort_without_a_reason(agent, superuser, interface):
    rebind, _ = _draining(agent, ["t"])
    assert NO_REASON in interface(superuser, rebind)
    assert Rebind.objects.get(pk=rebind.pk).state == RebindState.DRAINING
    assert not OperatorAction.objects.filter(action="rebind_abort").exists()


def test_the_service_refuses_an_abort_without_a_reason_and_records_one(agent):
    rebind, _ = _draining(agent, ["t"])
    with pytest.raises(RebindInvalid) as refused:
        rebind_abort(rebind.pk, actor="ops", reason=" \n ")
    assert (refused.value.field, refused.value.description) == ("reason", NO_REASON)
    assert rebind_abort(rebind.pk, actor="ops", reason=" wrong prefix ").reason == (
        "aborted: wrong prefix"
    )


def test_the_changelist_abort_records_the_reason_typed_beside_it(agent, superuser):
    rebind, _ = _draining(agent, ["t"])
    superuser.post(
        REBINDS, {"action": "abort", "_selected_action": [str(rebind.pk)], "reason": "typo"}
    )
    assert Rebind.objects.get(pk=rebind.pk).state == RebindState.ABORTED
    assert OperatorAction.objects.get(action="rebind_abort").target["reason"] == "typo"


# --- one config of an agent's task --------------------------------------------------------------


def _config_command(agent, task_id: str, config_id: str, client) -> str:
    with pytest.raises(CommandError) as refused:
        call_command(
            "rebind",
            "start",
            agent.slug,
            "--config",
            task_id,
            config_id,
            "--url",
            f"{V2}x",
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert refused.value.returncode == 2
    return str(refused.value)


def _config_api(agent, task_id: str, config_id: str, client) -> str:
    api = api_client("runner", "view_rebind", "run_rebind")
    body = {"agent": agent.slug, "config": {"taskId": task_id, "configId": config_id}}
    answer = api.post("/api/v1/rebinds/", {**body, "preview": True}, format="json")
    assert answer.status_code == 400, answer.content
    return json.dumps(answer.json()["error"])


def _config_wizard(agent, task_id: str, config_id: str, client) -> str:
    data = {
        "agent": agent.slug,
        "operations": ["config"],
        "task_id": task_id,
        "config_id": config_id,
        "new_url": f"{V2}x",
    }
    page = client.post(f"{REBINDS}start/", data).content.decode()
    assert "Start a rebind" in page  # the form again, with the refusal
    return page.replace("&#x27;", "'")


@pytest.mark.parametrize("interface", [_config_command, _config_api, _config_wizard])
@pytest.mark.parametrize("case", ["unknown config", "another agent's task", "not a task id"])
def test_one_config_is_looked_up_once_with_one_refusal(agent, superuser, interface, case):
    mine = task_with_push(agent, f"{V1}mine", config_id="cfg-0")
    other = AgentFactory(slug="other", executor="external")
    theirs = task_with_push(other, f"{V1}theirs", config_id="cfg-0")
    task_id, config_id = {
        "unknown config": (str(mine.pk), "cfg-9"),
        "another agent's task": (str(theirs.pk), "cfg-0"),
        "not a task id": ("task-1", "cfg-0"),
    }[case]
    with pytest.raises(RebindInvalid) as refused:
        agent_push_config(agent, task_id, config_id)
    words = refused.value.description
    assert words == f"agent 'hooks' has no config {config_id!r} on task {task_id}"
    said = interface(agent, task_id, config_id, superuser)
    if interface is _config_api and case == "not a task id":
        assert "taskId" in said  # the API's body types it as a UUID: parsed before any lookup
    else:
        assert words in said
    assert not Rebind.objects.exists()
    assert agent_push_config(agent, str(mine.pk), "cfg-0").task_id == mine.pk


# --- the wizard's form parses; the pre-checks speak -----------------------------------------------


@pytest.mark.parametrize(
    ("fields", "form_field"),
    [
        ({"operations": ["rotate_key"], "at": "2020-01-01T00:00:00+00:00"}, "at"),
        ({"operations": ["move_prefix"], "move_from": V1}, "move_from"),
        ({"operations": ["rotate_key"], "new_url": f"{V2}x"}, "new_url"),
        ({"operations": ["rotate_key"], "new_token": "secret-never-shown"}, "new_url"),
        (
            {"operations": ["config"], "new_credentials": "c", "task_id": "", "config_id": ""},
            "new_auth_scheme",
        ),
    ],
)
def test_the_wizard_shows_the_pre_checks_own_refusal_on_its_field(
    agent, superuser, fields, form_field
):
    """What the form once re-checked itself (a past start, half a prefix, a URL or a token
    without its config, credentials without a scheme) it now only parses: the pre-check
    refuses it, in its words, on the field it names."""
    task = task_with_push(agent, f"{V1}t", config_id="cfg-0")
    if fields["operations"] == ["config"]:
        fields = {**fields, "task_id": str(task.pk), "config_id": "cfg-0"}
    data = {"agent": agent.slug, **fields}
    form = RebindForm(data)
    assert form.is_valid(), form.errors  # parsed: the rule is not the form's
    with pytest.raises(RebindInvalid) as refused:
        rebind_preview(form.rebind_request())
    assert REFUSED_FIELD[refused.value.field] == form_field
    said = f"{refused.value.field}: {refused.value.description}"
    page = superuser.post(f"{REBINDS}start/", data).content.decode().replace("&#x27;", "'")
    assert said in page
    assert "secret-never-shown" not in page
    form.refused(refused.value)
    assert list(form.errors) == [form_field]
    assert not Rebind.objects.exists()
