"""`/api/v1/rebinds/` over real HTTP against a live web process (uvicorn on the ASGI app,
tests/integration/api/conftest.py), as an integrator's script drives it: start a rebind now
and one at a time (scheduled), advance, extend, abort, cut over; every transition's illegal
case answered 409 `illegal_transition` with the body docs/api.md documents; a token of a
lower scope (or whose user lacks the permission) answered 403 with nothing changed. Each
answer is checked with the rows it wrote: the rebind, its moves and bindings, the clocked
job of a scheduled one and the audit rows.

The test process writes its set-up through the services and commits (transactional tests);
the web process checks the new URLs' SSRF policy with real DNS, so they are on loopback
(allowed there, and here by `loopback_receivers`); nothing needs to listen."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django_celery_beat.models import ClockedSchedule, PeriodicTask

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.factories import AgentFactory
from tests.protocol_push import live_open_task
from webhooks.models import ChannelMove, PushBinding, Rebind, RebindState
from webhooks.rebinds.machine import TRANSITIONS, IllegalRebindTransition

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_receivers")]

V1 = "http://127.0.0.1:9/hooks/v1/"
V2 = "http://127.0.0.1:9/hooks/v2/"
ELSEWHERE = "http://127.0.0.2:9/elsewhere/"

# The API's path for each operation of the state machine (advance has no illegal case: it
# takes a rebind as far as it can go, which may be nowhere).
PATHS = {
    "cut_over": "cutover",
    "extend": "extend",
    "abort": "abort",
    "move_now": "move-now",
    "finish_on_old": "finish-on-old",
    "rebind_orphans": "rebind-orphans",
}


def _agent(web, slug: str, in_flight: int = 3) -> None:
    """`in_flight` working tasks with a config under V1, a finished one under V1 and a working
    one elsewhere (out of a V1 move's scope): opened through the live web process (SendMessage
    with an inline push config), as a client opens them."""
    agent = AgentFactory(slug=slug, executor="external")
    urls = [f"{V1}task-{i}" for i in range(in_flight + 1)] + [f"{ELSEWHERE}task-x"]
    for i, url in enumerate(urls):
        push = {"id": f"cfg-{i}", "url": url}
        task_id = live_open_task(web.url, agent, push=push, text=f"m{i}")
        services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
        if i == in_flight:
            services.task_transition(task_id=task_id, to_state=TaskState.COMPLETED)


def _move(slug: str, **extra: Any) -> dict[str, Any]:
    return {
        "agent": slug,
        "movePrefix": {"old": V1, "new": V2},
        "policy": "drain",
        "deadlineSeconds": 3600,
        **extra,
    }


def _moment(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def _audit(slug: str) -> list[tuple[str, str, dict]]:
    rows = OperatorAction.objects.filter(target__agent=slug).order_by("created_at", "id")
    return list(rows.values_list("actor", "action", "target"))


def _current_urls(slug: str) -> list[str]:
    """The URL of every config's binding taking writes (not retired)."""
    return sorted(
        PushBinding.objects.filter(
            config__task__agent__slug=slug, retired_at__isnull=True
        ).values_list("url", flat=True)
    )


def _snapshot(rebind_id: str) -> tuple:
    """Everything a refused call must leave as it was."""
    rebind = Rebind.objects.get(pk=rebind_id)
    moves = sorted(ChannelMove.objects.filter(rebind=rebind).values_list("pk", "state"))
    return (
        rebind.state,
        rebind.deadline,
        rebind.extended_at,
        rebind.finished_at,
        rebind.reason,
        moves,
        OperatorAction.objects.count(),
        sorted(PushBinding.objects.values_list("pk", "retired_at", "activated_at")),
    )


def test_a_rebind_started_now_is_read_extended_and_cut_over(api_web, tokens):
    _agent(api_web, "live-now")
    api = tokens.client("rebind", name="rebinder")
    actor = "api:rebinder-user"

    started = api.post("/api/v1/rebinds/", json=_move("live-now", reason="to v2"))
    assert started.status_code == 201, started.text
    body = started.json()
    rebind_id = body["id"]
    assert (body["agent"], body["state"], body["policy"]) == ("live-now", "draining", "drain")
    assert (body["moveFrom"], body["moveTo"], body["actor"]) == (V1, V2, actor)
    rebind = Rebind.objects.get(pk=rebind_id)
    assert (rebind.state, rebind.deadline_seconds, rebind.reason) == ("draining", 3600, "to v2")
    assert _moment(body["deadline"]) == rebind.deadline
    # The three in-flight tasks under V1 move, not the finished one nor the one elsewhere.
    moves = ChannelMove.objects.filter(rebind=rebind)
    assert moves.count() == 3
    assert {m.old_binding.url for m in moves.select_related("old_binding")} == {
        f"{V1}task-{i}" for i in range(3)
    }

    detail = api.get(f"/api/v1/rebinds/{rebind_id}")
    assert detail.status_code == 200, detail.text
    assert len(detail.json()["onOldVersion"]) == 3
    assert detail.json()["counts"] == Rebind.objects.get(pk=rebind_id).counts
    listed = api.get("/api/v1/rebinds/", params={"state": "draining", "agent": "live-now"})
    assert [r["id"] for r in listed.json()["results"]] == [rebind_id]

    # Another rebind over the same scope: 409 rebind_conflict naming it; nothing written.
    conflict = api.post("/api/v1/rebinds/", json={"agent": "live-now", "rotateKey": True})
    assert conflict.status_code == 409, conflict.text
    assert conflict.json()["error"]["code"] == "rebind_conflict"
    assert conflict.json()["error"]["rebind"] == rebind_id
    assert Rebind.objects.count() == 1

    # Extend: the deadline moves by the seconds asked, and the extension is audited.
    before = Rebind.objects.get(pk=rebind_id).deadline
    extended = api.post(f"/api/v1/rebinds/{rebind_id}/extend", json={"seconds": 900})
    assert extended.status_code == 200, extended.text
    after = Rebind.objects.get(pk=rebind_id)
    assert after.deadline == before + dt.timedelta(seconds=900)
    assert _moment(extended.json()["deadline"]) == after.deadline
    assert after.extended_at is not None
    assert after.state == "draining"
    bad = api.post(f"/api/v1/rebinds/{rebind_id}/extend", json={"seconds": 0})
    assert bad.status_code == 400, bad.text
    assert "seconds" in bad.json()["error"]["fields"]
    assert Rebind.objects.get(pk=rebind_id).deadline == after.deadline

    # Cut over: every task still on V1 is orphaned (with a final notice on its old channel).
    cut = api.post(f"/api/v1/rebinds/{rebind_id}/cutover")
    assert cut.status_code == 200, cut.text
    assert cut.json()["state"] == RebindState.CUT_OVER
    rebind = Rebind.objects.get(pk=rebind_id)
    assert (rebind.state, rebind.finished_at is not None) == ("cut_over", True)
    assert set(ChannelMove.objects.filter(rebind=rebind).values_list("state", flat=True)) == {
        "orphaned"
    }
    actions = [(a, action) for a, action, _ in _audit("live-now")]
    assert actions == [
        (actor, "rebind_start"),
        (actor, "rebind_drain"),
        (actor, "rebind_extend"),
        (actor, "rebind_cut_over"),
    ]
    assert _audit("live-now")[2][2]["seconds"] == 900


def test_a_scheduled_rebind_waits_for_its_time_then_advances_and_is_aborted(api_web, tokens):
    _agent(api_web, "live-at")
    api = tokens.client("rebind", name="scheduler")
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=3)
    started = api.post("/api/v1/rebinds/", json=_move("live-at", at=at.isoformat()))
    assert started.status_code == 201, started.text
    rebind_id = started.json()["id"]
    assert started.json()["state"] == RebindState.SCHEDULED
    assert _moment(started.json()["scheduledFor"]) == at
    rebind = Rebind.objects.get(pk=rebind_id)
    assert (rebind.state, rebind.started_at) == ("scheduled", None)
    assert not ChannelMove.objects.filter(rebind=rebind).exists()
    job = PeriodicTask.objects.get(name=f"rebind {rebind_id}")
    assert (job.one_off, job.clocked.clocked_time) == (True, rebind.scheduled_for)
    on_v1 = sorted([f"{V1}task-{i}" for i in range(4)] + [f"{ELSEWHERE}task-x"])
    assert _current_urls("live-at") == on_v1

    # Advanced before its time: nothing to do yet.
    early = api.post(f"/api/v1/rebinds/{rebind_id}/advance")
    assert early.status_code == 200, early.text
    assert early.json()["state"] == RebindState.SCHEDULED
    assert Rebind.objects.get(pk=rebind_id).state == "scheduled"

    while dt.datetime.now(dt.UTC) <= at:
        time.sleep(0.2)
    advanced = api.post(f"/api/v1/rebinds/{rebind_id}/advance")
    assert advanced.status_code == 200, advanced.text
    assert advanced.json()["state"] == RebindState.DRAINING
    rebind = Rebind.objects.get(pk=rebind_id)
    assert rebind.started_at is not None
    assert ChannelMove.objects.filter(rebind=rebind).count() == 3

    aborted = api.post(f"/api/v1/rebinds/{rebind_id}/abort", json={"reason": "wrong prefix"})
    assert aborted.status_code == 200, aborted.text
    assert aborted.json()["state"] == RebindState.ABORTED
    rebind = Rebind.objects.get(pk=rebind_id)
    assert rebind.state == "aborted"
    assert rebind.finished_at is not None
    assert rebind.reason.endswith("aborted: wrong prefix")
    # Nothing had moved yet (no notice delivered): every config is back on its V1 binding.
    assert _current_urls("live-at") == on_v1
    audit = _audit("live-at")
    assert [(actor, action) for actor, action, _ in audit] == [
        ("api:scheduler-user", "rebind_schedule"),
        ("system:rebind-monitor", "rebind_fire"),
        ("api:scheduler-user", "rebind_drain"),  # the rebind's own actor
        ("api:scheduler-user", "rebind_abort"),
    ]
    assert (audit[-1][2]["was"], audit[-1][2]["reason"]) == ("draining", "wrong prefix")


def test_a_scheduled_rebind_aborted_before_its_time_removes_its_clocked_job(api_web, tokens):
    _agent(api_web, "live-later")
    api = tokens.client("rebind", name="planner")
    at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    rebind_id = api.post("/api/v1/rebinds/", json=_move("live-later", at=at.isoformat())).json()[
        "id"
    ]
    assert PeriodicTask.objects.filter(name=f"rebind {rebind_id}").exists()
    aborted = api.post(f"/api/v1/rebinds/{rebind_id}/abort", json={"reason": "not needed"})
    assert aborted.status_code == 200, aborted.text
    assert Rebind.objects.get(pk=rebind_id).state == "aborted"
    assert not PeriodicTask.objects.filter(name=f"rebind {rebind_id}").exists()
    assert not ClockedSchedule.objects.exists()
    assert [a for _, a, _ in _audit("live-later")] == ["rebind_schedule", "rebind_abort"]
    # In the past: refused on its field, nothing written.
    past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    refused = api.post("/api/v1/rebinds/", json=_move("live-later", at=past.isoformat()))
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["field"] == "at"
    assert Rebind.objects.count() == 1


def test_a_new_url_the_ssrf_policy_refuses_is_a_400_and_writes_nothing(api_web, tokens):
    _agent(api_web, "live-ssrf", in_flight=1)
    api = tokens.client("rebind")
    private = {"agent": "live-ssrf", "movePrefix": {"old": V1, "new": "http://10.1.2.3/v2/"}}
    refused = api.post("/api/v1/rebinds/", json=private)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_request", "movePrefix.new")
    assert "10.1.2.3" in error["message"]
    preview = api.post("/api/v1/rebinds/", json={**private, "preview": True})
    assert preview.status_code == 400, preview.text
    assert not Rebind.objects.exists()
    assert not _audit("live-ssrf")


def _rebinds_in_every_state(api_web, api) -> dict[str, str]:
    """One rebind per state an operation can be refused in, each on its own agent, driven
    there through the API: state → rebind id."""
    out = {}
    at = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    _agent(api_web, "st-scheduled", in_flight=1)
    out["scheduled"] = api.post("/api/v1/rebinds/", json=_move("st-scheduled", at=at)).json()["id"]
    _agent(
        api_web, "st-preparing", in_flight=1
    )  # a rotation: the new key is published, not signing
    out["preparing"] = api.post(
        "/api/v1/rebinds/", json={"agent": "st-preparing", "rotateKey": True}
    ).json()["id"]
    for state in ("draining", "cut_over", "aborted"):
        slug = f"st-{state}".replace("_", "-")  # a slug a client can reach (agents.models)
        _agent(api_web, slug, in_flight=1)
        out[state] = api.post("/api/v1/rebinds/", json=_move(slug)).json()["id"]
    assert api.post(f"/api/v1/rebinds/{out['cut_over']}/cutover").status_code == 200
    aborted = api.post(f"/api/v1/rebinds/{out['aborted']}/abort", json={"reason": "states"})
    assert aborted.status_code == 200
    _agent(api_web, "st-completed", in_flight=0)  # nothing in flight: the drain completes at once
    out["completed"] = api.post("/api/v1/rebinds/", json=_move("st-completed")).json()["id"]
    states = {str(pk): state for pk, state in Rebind.objects.values_list("pk", "state")}
    assert {state: states[rebind_id] for state, rebind_id in out.items()} == {s: s for s in out}, (
        states
    )
    return out


def _body_for(operation: str, rebind_id: str) -> dict:
    if operation == "extend":
        return {"seconds": 600}
    if operation in ("move_now", "finish_on_old"):
        move = ChannelMove.objects.filter(rebind_id=rebind_id).first()
        return {"moves": [move.pk if move else 1]}
    if operation == "abort":
        return {"reason": "refused"}
    return {}


def test_every_illegal_transition_is_a_409_with_the_documented_body_and_changes_nothing(
    api_web, tokens
):
    api = tokens.client("rebind", name="stepper")
    by_state = _rebinds_in_every_state(api_web, api)
    refused = 0
    for operation, path in PATHS.items():
        for state, rebind_id in by_state.items():
            if state in TRANSITIONS[operation]:
                continue
            before = _snapshot(rebind_id)
            answer = api.post(
                f"/api/v1/rebinds/{rebind_id}/{path}", json=_body_for(operation, rebind_id)
            )
            assert answer.status_code == 409, (operation, state, answer.text)
            assert answer.json() == {
                "error": {
                    "code": "illegal_transition",
                    "message": str(IllegalRebindTransition(operation, state)),
                    "state": state,
                }
            }, (operation, state)
            assert _snapshot(rebind_id) == before, (operation, state)
            refused += 1
    assert refused == 27  # every (operation, state) pair the machine has no arrow for
    # Advance is never refused: on a finished rebind it changes nothing.
    for state in ("completed", "cut_over", "aborted"):
        before = _snapshot(by_state[state])
        answer = api.post(f"/api/v1/rebinds/{by_state[state]}/advance")
        assert (answer.status_code, answer.json()["state"]) == (200, state)
        assert _snapshot(by_state[state]) == before
    missing = api.post("/api/v1/rebinds/00000000-0000-0000-0000-000000000001/cutover")
    assert missing.status_code == 404, missing.text
    assert missing.json()["error"]["code"] == "not_found"


def test_a_token_of_a_lower_scope_gets_403_and_changes_nothing(api_web, tokens):
    _agent(api_web, "live-scope")
    runner = tokens.client("rebind", name="runner")
    rebind_id = runner.post("/api/v1/rebinds/", json=_move("live-scope")).json()["id"]
    move = ChannelMove.objects.filter(rebind_id=rebind_id).first().pk
    # `read` and `operate` scopes lack run_rebind; a `rebind` token whose user is only in the
    # operator group is capped by its user.
    capped_user = tokens.user("capped-user", group="operator")
    callers = {
        "read": tokens.client("read", name="reader"),
        "operate": tokens.client("operate", name="operator"),
        "rebind, user without run_rebind": tokens.client("rebind", name="capped", user=capped_user),
    }
    calls = [
        ("/api/v1/rebinds/", _move("live-scope", force=True)),
        ("/api/v1/rebinds/", {**_move("live-scope"), "preview": True}),
        (f"/api/v1/rebinds/{rebind_id}/advance", {}),
        (f"/api/v1/rebinds/{rebind_id}/extend", {"seconds": 600}),
        (f"/api/v1/rebinds/{rebind_id}/move-now", {"moves": [move]}),
        (f"/api/v1/rebinds/{rebind_id}/finish-on-old", {"moves": [move]}),
        (f"/api/v1/rebinds/{rebind_id}/cutover", {}),
        (f"/api/v1/rebinds/{rebind_id}/abort", {"reason": "not mine"}),
    ]
    before = _snapshot(rebind_id)
    for who, client in callers.items():
        for path, body in calls:
            answer = client.post(path, json=body)
            assert answer.status_code == 403, (who, path, answer.text)
            assert answer.json()["error"]["code"] == "permission_denied", (who, path)
        # Reading needs only view_rebind, which every one of them has.
        assert client.get(f"/api/v1/rebinds/{rebind_id}").status_code == 200, who
    assert _snapshot(rebind_id) == before
    assert Rebind.objects.count() == 1
    assert {actor for actor, _, _ in _audit("live-scope")} == {"api:runner-user"}
