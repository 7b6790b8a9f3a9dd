"""Push delivery and a drain rebind on a hosted agent's tasks (issue 45), with real processes:
a hosted a2a-sdk AgentExecutor (the example currency agent, with a "tick <n>" answer that
streams: tests/hosted_agents.py TickingCurrency) created with `agent_create`, a Celery worker
running it and delivering (the project root on its PYTHONPATH, as docs/agents.md asks), beat
firing the sweepers and the rebind monitor, a live web process the client and the receivers
talk to, and the strict receiver of docs/webhooks-receiving.md section 5 on aiohttp
(tests/receivers/verifying_receiver.py: it verifies every delivery and answers 200 only to
what it verified).

Tasks and push configs are made through the protocol on the live web process (SendMessage
with an inline config, CreateTaskPushNotificationConfig); the operator's rebind is the
`rebind` command. The helpers and the live web process (`web`) are the rebind process tests'
(test_rebind_processes.py), and the delivery checks those of tests/webhook_checks.py.

At-least-once (docs/webhooks-receiving.md section 4): a delivery may arrive more than once,
always with its `webhook-id`; it is accepted once, and the next one of its config is sent
only after that. Nothing else is allowed: no event missing, none delivered twice under two
ids or on two channels, none out of order.
"""

from __future__ import annotations

import json

import httpx
import pytest
from django.conf import settings

from agents.services import agent_create
from tasks.models import Task, TaskEvent
from tasks.states import TaskState
from tests.factories import user_message
from tests.integration.webhooks.test_rebind_processes import _web as _web  # noqa: F401 (fixture)
from tests.integration.webhooks.test_rebind_processes import (
    all_delivered,
    assert_strict_notice,
    notice_of,
    run_rebind,
    start_drain,
    verifying_receiver,
    wait_state,
)
from tests.integration.webhooks.test_rebind_processes import web as web  # noqa: F401 (fixture)
from tests.processes import ROOT, wait_until
from tests.protocol_push import card_jwks_url, live_base_url, live_open_task, live_register
from tests.readiness_helpers import wait_workers_live
from tests.webhook_checks import (
    LOOPBACK_DELIVERY_MARKS,
    assert_delivered,
    assert_in_order,
    deliveries,
    owed_seqs,
    start_beat,
    start_worker,
    verify,
)
from tests.webhook_receiver import Record
from webhooks.models import ChannelMove, DeliveryState, PushConfig, RebindState

pytestmark = LOOPBACK_DELIVERY_MARKS

EXECUTOR = "python:tests.hosted_agents:TickingCurrency"
V1 = {"A2A-Version": "1.0"}


@pytest.fixture
def agent(transactional_db):
    # A 1 s card max-age: a key rotation's overlap (the JWKS is cached no longer than the card).
    return agent_create(
        slug="currency",
        name="Currency",
        description="converts amounts between currencies",
        executor=EXECUTOR,
        card_max_age=1,
    )


def serve_hosted(procs, web, agent, mode: str):
    """A worker that can run the agent's code and deliver, beat, and the card served (the
    worker reported that the code loads: docs/agents.md); then the strict receiver, which
    reads the JWKS the card names."""
    start_worker(procs, PYTHONPATH=str(ROOT))
    start_beat(procs)
    wait_workers_live(web.url)
    card = f"{live_base_url(web.url, agent)}/.well-known/agent-card.json"
    wait_until(
        lambda: httpx.get(card, timeout=5).status_code == 200,
        timeout=30,
        message="the hosted agent's card served",
    )
    return verifying_receiver(procs, web, agent, mode)


def open_hosted(web, agent, receiver, name: str, text: str) -> Task:
    """SendMessage to the live web process with an inline config `cfg-<name>` at the
    receiver's /hooks/v1/task-<name>."""
    push = {"id": f"cfg-{name}", "url": f"{receiver.origin}/hooks/v1/task-{name}"}
    return Task.objects.get(pk=live_open_task(web.url, agent, push=push, text=text))


def answer(web, agent, task: Task, text: str) -> None:
    """The client's next message on `task` (SendMessage, returnImmediately): the hosted
    executor's execute() runs again with the task as it is stored."""
    message = user_message(text, taskId=str(task.pk), contextId=task.context_id)
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": message, "configuration": {"returnImmediately": True}},
    }
    got = httpx.post(live_base_url(web.url, agent), json=body, headers=V1, timeout=15)
    assert "result" in got.json(), got.text


def wait_task(task: Task, state: TaskState, timeout: float = 30) -> Task:
    return wait_until(
        lambda: Task.objects.filter(pk=task.pk, state=state).first(),
        timeout=timeout,
        message=f"task {task.pk} {state.short}",
    )


def config_of(task: Task) -> PushConfig:
    return PushConfig.objects.get(task=task)


def verified_by_the_receiver(records: list[Record]) -> None:
    rejected = [(r.path, r.answer) for r in records if r.answer.get("kind") != "verified"]
    assert rejected == []
    assert {r.answer["status"] for r in records} == {200}


def bodies(records: list[Record]) -> list[dict]:
    """What each first arrival carried (a retry repeats its `webhook-id`)."""
    firsts: dict[str, Record] = {}
    for record in records:
        firsts.setdefault(record.webhook_id, record)
    return [json.loads(r.body) for r in firsts.values()]


def state_of(body: dict) -> str | None:
    if "task" in body:
        return body["task"]["status"]["state"]
    return body.get("statusUpdate", {}).get("status", {}).get("state")


def chunk_text(body: dict) -> str:
    return body["artifactUpdate"]["artifact"]["parts"][0]["text"]


def test_every_event_of_a_hosted_task_reaches_the_strict_receiver_signed_in_order(
    web, procs, tmp_path, agent
):
    """One task configured inline (SendMessage), one registered while it waits for input
    (CreateTaskPushNotificationConfig), then answered: each config gets its snapshot and
    every status and artifact event the executor wrote after it, verified, in order."""
    receiver = serve_hosted(procs, web, agent, "channels")
    streamed = open_hosted(web, agent, receiver, "a", "100 USD to EUR")
    asking = Task.objects.get(pk=live_open_task(web.url, agent, text="100 USD"))
    wait_task(asking, TaskState.INPUT_REQUIRED)
    url = f"{receiver.origin}/hooks/v1/task-b"
    live_register(web.url, agent, asking.pk, {"id": "cfg-b", "url": url})
    answer(web, agent, asking, "EUR")
    wait_task(streamed, TaskState.COMPLETED)
    wait_task(asking, TaskState.COMPLETED)
    all_delivered()

    records = receiver.records()
    verified_by_the_receiver(records)
    for task, name in ((streamed, "a"), (asking, "b")):
        config = config_of(task)
        mine = assert_delivered(
            receiver.at(f"/hooks/v1/task-{name}"), config, agent, exactly_once=False
        )
        assert {r.header("x-a2a-task-id") for r in mine} == {str(task.pk)}
        got = bodies(mine)
        assert state_of(got[-1]) == "TASK_STATE_COMPLETED"
        chunks = [chunk_text(b) for b in got if "artifactUpdate" in b]
        assert chunks == ["100 USD = ", "92.00 EUR"]
    # Inline: the snapshot is the task as SendMessage created it, then the whole run.
    kinds = [r.header("x-a2a-event-kind") for r in records if r.path == "/hooks/v1/task-a"]
    got = bodies([r for r in records if r.path == "/hooks/v1/task-a"])
    assert [state_of(b) for b in got] == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        None,
        None,
        "TASK_STATE_COMPLETED",
    ]
    assert "notice" not in kinds
    # Registered in INPUT_REQUIRED: its snapshot says so, and the second execute() follows.
    got = bodies([r for r in records if r.path == "/hooks/v1/task-b"])
    assert state_of(got[0]) == "TASK_STATE_INPUT_REQUIRED"
    assert [state_of(b) for b in got[1:]] == [
        "TASK_STATE_WORKING",
        None,
        None,
        "TASK_STATE_COMPLETED",
    ]


def assert_moved_in_order(
    receiver, agent, task: Task, name: str, jwks: str, new_kid: str | None = None
) -> tuple[list[Record], list[Record]]:
    """The task's config was moved by the drain: its deliveries are its snapshot and events
    on v1, the `channel-changed` notice on v1, then the rest of its events on v2 (held until
    the notice was delivered), every status and artifact event after the snapshot exactly
    once, each received in that order and verified. `new_kid`: the rotated key's id, which
    alone signs for the new channel (none: the old channel's keys). Returns the first
    arrivals on v1 (the notice last) and on v2."""
    config = config_of(task)
    rows = deliveries(config)  # in id order: the order a config's deliveries are sent in
    assert {d.state for d in rows} == {DeliveryState.DELIVERED}
    kinds = [d.kind for d in rows]
    assert kinds.count("notice") == 1, kinds
    assert kinds[0] == "snapshot"
    assert "snapshot" not in kinds[1:]  # a move opens no new snapshot: nothing is resent
    at = kinds.index("notice")
    versions = [d.binding.version for d in rows]
    assert versions == [1] * (at + 1) + [2] * (len(rows) - at - 1)
    # Nothing lost, nothing twice: every event after the snapshot, once, across both channels.
    assert [d.seq for d in rows if d.kind != "notice"] == owed_seqs(config)
    events = {e.seq: e.payload for e in TaskEvent.objects.filter(task=task)}
    for delivery in rows[1:]:
        if delivery.kind != "notice":
            assert json.loads(delivery.body) == events[delivery.seq]

    by_id = {str(d.event_id): d for d in rows}
    records = [r for r in receiver.records() if r.webhook_id in by_id]
    assert {r.header("x-a2a-task-id") for r in records} == {str(task.pk)}
    verified_by_the_receiver(records)
    verify(records, agent, url=receiver.url)
    try:
        assert_in_order(records, list(by_id))
    except AssertionError as exc:
        index = {eid: i for i, eid in enumerate(by_id)}
        sent = [(i, d.kind, d.seq, d.binding.version, d.attempts) for i, d in enumerate(rows)]
        got = [(index[r.webhook_id], r.n, round(r.at, 3)) for r in records]
        raise AssertionError(f"{exc}\ndeliveries {sent}\nreceived {got}") from None
    for record in records:
        delivery = by_id[record.webhook_id]
        version = delivery.binding.version
        assert record.body == delivery.body.encode()
        assert record.header("x-a2a-event-kind") == delivery.kind
        assert record.header("x-a2a-binding-version") == f"cfg-{name}.v{version}"
        assert record.path == f"/hooks/v{version}/task-{name}"
    firsts: dict[str, Record] = {}
    for record in records:
        firsts.setdefault(record.webhook_id, record)
    old = [firsts[str(d.event_id)] for d in rows[: at + 1]]
    new = [firsts[str(d.event_id)] for d in rows[at + 1 :]]
    payload = assert_strict_notice(old[-1], "channel-changed", jwks)
    assert payload["newChannel"]["version"] == f"cfg-{name}.v2"
    assert payload["newChannel"]["pathPrefix"] == "/hooks/v2/"
    kids = [new_kid] if new_kid else payload["oldChannel"]["keyIds"]
    assert payload["newChannel"]["keyIds"] == kids
    assert all(r.seq >= payload["fromSeq"] for r in new)
    # The new channel is signed by the new key (the strict receiver trusts only its kids).
    return old, new


def signed_by_the_new_key_in_time(rebind, new: list[Record], notice: Record) -> list[Record]:
    """Every delivery on the new channel is signed by keys the notice announced for the task
    (its old channel's and its new one's, all in the JWKS). The new key signs in every worker
    within A2A_SIGNING_KEY_CACHE_SECONDS of its activation (a2a_platform/settings.py), so what
    was received later than that (and a second for the send) carries it: returns those."""
    payload = notice_of(notice)
    announced = {*payload["oldChannel"]["keyIds"], *payload["newChannel"]["keyIds"]}
    for record in new:
        kids = set(record.header("x-a2a-signature-key-ids").split())
        assert kids, record.headers
        assert kids <= announced, (kids, announced)
    bound = rebind.activate_key_at.timestamp() + settings.A2A_SIGNING_KEY_CACHE_SECONDS + 1
    late = [r for r in new if r.at > bound]
    kid = rebind.new_key.kid
    unsigned = [r.seq for r in late if kid not in r.header("x-a2a-signature-key-ids").split()]
    assert unsigned == [], "received after every worker's key cache expired, without the new key"
    return late


@pytest.mark.parametrize("mode", ["jwks-poll", "channels"])
def test_a_drain_rebind_moves_a_hosted_agents_tasks_in_flight_to_the_new_channel(
    web, procs, tmp_path, agent, mode
):
    """Three hosted tasks: one finished, one waiting for input, one still streaming. The
    operator rotates the key and moves hooks/v1 → hooks/v2 with a drain; the client then
    answers the waiting one. Both in-flight tasks are told on v1 and go on on v2 (the
    streaming one mid-run), the finished one is left alone, the strict receiver accepts every
    delivery, and the rebind completes."""
    receiver = serve_hosted(procs, web, agent, mode)
    done = open_hosted(web, agent, receiver, "c", "100 USD to EUR")
    wait_task(done, TaskState.COMPLETED)
    asking = open_hosted(web, agent, receiver, "a", "100 USD")
    wait_task(asking, TaskState.INPUT_REQUIRED)
    all_delivered()
    streaming = open_hosted(web, agent, receiver, "b", "tick 120")  # 12 s of chunks
    wait_until(
        lambda: TaskEvent.objects.filter(task=streaming, kind="artifact").exists(),
        message="the streaming task's first chunk",
    )

    rebind = start_drain(agent, receiver)
    assert rebind.state in (RebindState.DRAINING, RebindState.COMPLETED)
    # The premise: the executor is still writing this task's events as the drain begins.
    assert Task.objects.get(pk=streaming.pk).state == TaskState.WORKING
    answer(web, agent, asking, "EUR")
    wait_task(asking, TaskState.COMPLETED)
    wait_task(streaming, TaskState.COMPLETED)
    rebind = wait_state(rebind, RebindState.COMPLETED)
    all_delivered()

    records = receiver.records()
    verified_by_the_receiver(records)
    assert rebind.counts["moved"] == 2
    moved = ChannelMove.objects.filter(rebind=rebind, state="moved")
    assert sorted(moved.values_list("config__task_id", flat=True)) == sorted(
        [asking.pk, streaming.pk]
    )
    jwks = card_jwks_url(agent, web_url=web.url)
    new_kid = rebind.new_key.kid

    old, new = assert_moved_in_order(receiver, agent, asking, "a", jwks, new_kid)
    signed_by_the_new_key_in_time(rebind, new, old[-1])
    # Answered after the drain began: the whole second execute() is on the new channel.
    assert [state_of(json.loads(r.body)) for r in old] == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_INPUT_REQUIRED",  # the notice: the task's unchanged status
    ]
    assert [state_of(json.loads(r.body)) for r in new] == [
        "TASK_STATE_WORKING",
        None,
        None,
        "TASK_STATE_COMPLETED",
    ]

    old, new = assert_moved_in_order(receiver, agent, streaming, "b", jwks, new_kid)
    # Its run outlasts the workers' key caches: its last deliveries carry the new key.
    assert signed_by_the_new_key_in_time(rebind, new, old[-1])
    # Mid-run: chunks on both channels, the end on the new one, all 120 chunks once.
    assert any("artifactUpdate" in json.loads(r.body) for r in old)
    assert any("artifactUpdate" in json.loads(r.body) for r in new)
    assert state_of(json.loads(new[-1].body)) == "TASK_STATE_COMPLETED"
    chunks = [chunk_text(b) for b in bodies(old + new) if "artifactUpdate" in b]
    assert chunks == [f"{i} " for i in range(120)]

    # Finished before the rebind: out of its scope, everything on v1, no notice.
    mine = assert_delivered(
        receiver.at("/hooks/v1/task-c"), config_of(done), agent, exactly_once=False
    )
    assert "notice" not in {r.header("x-a2a-event-kind") for r in mine}


def test_events_a_hosted_run_writes_as_its_notice_is_delivered_stay_in_order(
    web, procs, tmp_path, agent
):
    """Three hosted runs each stream a chunk every 10 ms while the operator drains hooks/v1 →
    hooks/v2, so each task's notice is delivered (and its new channel activated) while its
    run is writing. Every config's deliveries still arrive in order: nothing written for the
    new channel overtakes what was written before it (docs/rebinds.md: "held events released
    in order")."""
    receiver = serve_hosted(procs, web, agent, "channels")
    tasks = [open_hosted(web, agent, receiver, str(i), "tick 200 0.01") for i in range(3)]
    wait_until(
        lambda: all(TaskEvent.objects.filter(task=t, kind="artifact").exists() for t in tasks),
        message="every run's first chunk",
    )
    origin = receiver.origin
    rebind = run_rebind(
        "start", agent.slug, "--move-prefix", f"{origin}/hooks/v1/", f"{origin}/hooks/v2/"
    )
    for task in tasks:
        wait_task(task, TaskState.COMPLETED, timeout=60)
    rebind = wait_state(rebind, RebindState.COMPLETED)
    all_delivered(timeout=120)

    verified_by_the_receiver(receiver.records())
    moved = set(ChannelMove.objects.filter(rebind=rebind, state="moved").values_list("task_id"))
    assert moved == {(t.pk,) for t in tasks}  # each run was still writing as the drain began
    jwks = card_jwks_url(agent, web_url=web.url)
    for i, task in enumerate(tasks):
        old, new = assert_moved_in_order(receiver, agent, task, str(i), jwks)
        chunks = [chunk_text(b) for b in bodies(old + new) if "artifactUpdate" in b]
        assert chunks == [f"{n} " for n in range(200)]
