"""Rebinds with real processes: a web process (the JWKS the receivers read, GetTask), a
Celery worker delivering, beat firing the rebind monitor and clocked jobs, and receivers on
aiohttp that verify each delivery live as a client would (tests/receivers/
verifying_receiver.py, the strict receiver of docs/webhooks-receiving.md section 5): one
re-reads the JWKS every 2 s and trusts only what it last read, the other keeps a per-task
channel history (webhooks.receiver.ChannelTrust). Both read every delivery with
parse_channel_notice; a rejected delivery (a malformed notice, one naming another JWKS than
the card's) is answered non-2xx and recorded with its reason.

Tasks and push configs are made through the live web process (SendMessage, Create-
TaskPushNotificationConfig over HTTP), so each binding's issuer is what the protocol stores:
the agent's URL on that process.

The operator runs the rebind with the `rebind` command, as documented in the README.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading

import httpx
import pytest
from django.core.management import call_command
from django_celery_beat.models import PeriodicTask

from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests import live
from tests.factories import AgentFactory
from tests.processes import ROOT, process_env, wait_until
from tests.protocol_push import card_jwks_url, live_base_url, live_open_task, task_with_push
from tests.readiness_helpers import wait_workers_live
from tests.webhook_checks import ALLOWED, start_beat, start_worker
from tests.webhook_receiver import ReceiverProcess
from webhooks.errors import RebindConflict
from webhooks.models import (
    Alert,
    AlertKind,
    ChannelMove,
    Delivery,
    DeliveryState,
    PushConfig,
    Rebind,
    RebindState,
)
from webhooks.rebinds.operations import RebindRequest, rebind_start

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]

URI = "urn:a2a-platform:ext:push-channel:v1"


@pytest.fixture(scope="module")
def _web(django_db_setup, django_db_blocker, tmp_path_factory):
    web = live.start_web(
        tmp_path_factory.mktemp("web"),
        A2A_WEBHOOK_ALLOWED_NETWORKS=ALLOWED,
        A2A_SHUTDOWN_GRACE_SECONDS="0",
        A2A_AGENT_CACHE_SECONDS="0",
    )
    try:
        yield web
    finally:
        web.stop()


@pytest.fixture
def web(transactional_db, _web) -> live.LiveWeb:
    return _web


@pytest.fixture
def agent(transactional_db):
    # external: the test drives the transitions; a 1 s card max-age is the key's overlap.
    return AgentFactory(executor="external", signing_key=True, card_max_age=1)


def verifying_receiver(procs, web, agent, mode: str) -> ReceiverProcess:
    """An aiohttp receiver verifying as a client would, stopped with `procs`'s processes (it
    polls the JWKS for ever: one left running outlived the test run). It trusts the JWKS the
    agent's card advertises, and the agent's URL as a webhook JWT's issuer."""
    jwks = card_jwks_url(agent, web_url=web.url)
    assert jwks == f"{web.url}/{agent.slug}/.well-known/jwks.json"
    receiver = ReceiverProcess(
        procs.log_dir,
        name=mode,
        path="/hooks/v1/",
        command=[
            sys.executable,
            "-m",
            "tests.receivers.verifying_receiver",
            "--jwks",
            jwks,
            "--mode",
            mode,
            "--issuer",
            live_base_url(web.url, agent),
        ],
    )
    receiver.start()
    procs.adopt(receiver.proc)
    return receiver


def open_tasks(web, agent, receiver, n: int, prefix: str = "/hooks/v1/") -> list[Task]:
    """`n` tasks opened through the live web process (SendMessage with an inline push config
    `cfg-<i>` at the receiver's `<prefix>task-<i>`), then WORKING."""
    tasks = []
    for i in range(n):
        push = {"id": f"cfg-{i}", "url": f"{receiver.origin}{prefix}task-{i}"}
        task = Task.objects.get(pk=live_open_task(web.url, agent, push=push))
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        tasks.append(task)
    return tasks


def all_delivered(timeout: float = 60, ended=(DeliveryState.DELIVERED,)) -> None:
    """Wait until every delivery is delivered (or in another of the `ended` states)."""
    try:
        wait_until(
            lambda: (
                Delivery.objects.exists() and not Delivery.objects.exclude(state__in=ended).exists()
            ),
            timeout=timeout,
            message="every delivery delivered",
        )
    except TimeoutError:
        left = Delivery.objects.exclude(state__in=ended).values_list(
            "pk", "config_id", "kind", "seq", "state", "attempts", "last_error"
        )
        heads = PushConfig.objects.values_list("pk", "head_due_at")
        raise AssertionError(f"not delivered: {list(left)}; heads {list(heads)}") from None


def run_rebind(*args: str) -> Rebind:
    out = io.StringIO()
    call_command("rebind", *args, stdout=out, stderr=io.StringIO())
    return Rebind.objects.get(pk=out.getvalue().strip().splitlines()[0])


def start_drain(agent, receiver) -> Rebind:
    """The incident's rebind as the operator starts it: the agent's key rotated and the
    receiver's hooks/v1 moved to hooks/v2 with a drain (an hour's deadline)."""
    origin = receiver.origin
    return run_rebind(
        "start",
        agent.slug,
        "--rotate-key",
        "--move-prefix",
        f"{origin}/hooks/v1/",
        f"{origin}/hooks/v2/",
        "--policy",
        "drain",
        "--deadline",
        "1h",
    )


def wait_state(rebind: Rebind, *states: str, timeout: float = 60) -> Rebind:
    return wait_until(
        lambda: Rebind.objects.filter(pk=rebind.pk, state__in=states).first(),
        timeout=timeout,
        message=f"rebind {rebind.pk} {states}",
    )


def by_task(records) -> dict[str, list]:
    out: dict[str, list] = {}
    for record in sorted(records, key=lambda r: r.n):
        out.setdefault(record.header("x-a2a-task-id"), []).append(record)
    return out


def notice_of(record) -> dict | None:
    body = json.loads(record.body)
    return (body.get("statusUpdate", {}).get("metadata") or {}).get(URI)


def assert_strict_notice(record, kind: str, jwks: str) -> dict:
    """The notice `record` carries names the card's JWKS, and the strict receiver verified it
    and read it with parse_channel_notice (its answer says what it read): its payload."""
    payload = notice_of(record)
    assert payload is not None, record.body
    assert (payload["notice"], payload["jwksUrl"]) == (kind, jwks)
    assert record.answer == {"status": 200, "kind": "verified", "notice": kind, "jwksUrl": jwks}
    return payload


@pytest.mark.parametrize("mode", ["jwks-poll", "channels"])
def test_the_incident_under_drain_strands_no_task(web, procs, tmp_path, agent, mode):
    """Three tasks WORKING; the operator rotates the key and moves hooks/v1 → hooks/v2 with
    a drain; the tasks then wait for input. Both receivers accept every delivery, each task's
    notice arrives on the old path before anything on the new one, and the rebind completes
    with every task moved."""
    receiver = verifying_receiver(procs, web, agent, mode)
    start_worker(procs)
    start_beat(procs)
    wait_workers_live(web.url)
    tasks = open_tasks(web, agent, receiver, 3)
    all_delivered()

    rebind = start_drain(agent, receiver)
    # The command returns once the rebind drains; a fast worker may have delivered the three
    # notices (and so completed it) by the time the row is read.
    assert rebind.state in (RebindState.DRAINING, RebindState.COMPLETED)
    for task in tasks:
        services.task_transition(task_id=task.pk, to_state=TaskState.INPUT_REQUIRED)
    rebind = wait_state(rebind, RebindState.COMPLETED)  # beat's monitor completes it
    all_delivered()

    records = receiver.records()
    rejected = [(r.path, r.answer.get("reason")) for r in records if r.answer["status"] != 200]
    assert rejected == []
    assert rebind.counts["moved"] == 3
    jwks = card_jwks_url(agent, web_url=web.url)
    for task in tasks:
        mine = by_task(records)[str(task.pk)]
        paths = [r.path.rsplit("/", 2)[1] for r in mine]  # v1 / v2
        kinds = [r.header("x-a2a-event-kind") for r in mine]
        notice_at = kinds.index("notice")
        assert paths[: notice_at + 1] == ["v1"] * (notice_at + 1)
        assert paths[notice_at + 1 :] == ["v2"]  # INPUT_REQUIRED, on the new path only
        assert json.loads(mine[-1].body)["statusUpdate"]["status"]["state"] == (
            "TASK_STATE_INPUT_REQUIRED"
        )
        payload = assert_strict_notice(mine[notice_at], "channel-changed", jwks)
        assert payload["newChannel"]["pathPrefix"] == "/hooks/v2/"
        assert payload["newChannel"]["keyIds"] == [rebind.new_key.kid]


def test_cutover_orphans_visibly_with_a_final_notice(web, procs, tmp_path, agent):
    receiver = verifying_receiver(procs, web, agent, "channels")
    start_worker(procs)
    start_beat(procs)
    wait_workers_live(web.url)
    tasks = open_tasks(web, agent, receiver, 2)
    all_delivered()
    origin = receiver.origin
    rebind = run_rebind(
        "start",
        agent.slug,
        "--move-prefix",
        f"{origin}/hooks/v1/",
        f"{origin}/hooks/v2/",
        "--policy",
        "cutover",
    )
    assert rebind.state == RebindState.CUT_OVER
    all_delivered()
    for task in tasks:
        got = httpx.get(
            f"{web.url}/{agent.slug}/tasks/{task.pk}", headers={"A2A-Version": "1.0"}, timeout=10
        )
        assert got.status_code == 200, got.text
        mark = got.json()["metadata"][URI]
        assert mark["orphaned"] is True
        assert mark["orphanedChannels"][0]["rebindId"] == str(rebind.pk)
    records = receiver.records()
    jwks = card_jwks_url(agent, web_url=web.url)
    finals = [r for r in records if r.header("x-a2a-event-kind") == "notice"]
    assert len(finals) == 2
    for final in finals:
        assert_strict_notice(final, "channel-orphaned", jwks)
    # After the cutover, a task's events wait (held, visible) for an operator's re-bind.
    services.task_transition(task_id=tasks[0].pk, to_state=TaskState.COMPLETED)
    held = Delivery.objects.get(task=tasks[0], seq=3)
    assert held.state == DeliveryState.HELD
    assert all(r.answer["status"] == 200 for r in receiver.records())


def test_a_worker_killed_mid_drain_loses_nothing_and_sends_no_notice_twice(
    web, procs, tmp_path, agent, receivers
):
    """The receiver answers slowly, the worker is SIGKILLed while notices are in flight and
    started again: the drain completes, every notice arrives, and each task's notice keeps
    one event id across its tries."""
    slow = receivers.start(hang=0.3)
    worker = start_worker(procs)
    start_beat(procs)
    wait_workers_live(web.url)
    tasks = open_tasks(web, agent, slow.at("/hooks/v1/"), 12)
    all_delivered()
    rebind = run_rebind(
        "start",
        agent.slug,
        "--move-prefix",
        f"{slow.origin}/hooks/v1/",
        f"{slow.origin}/hooks/v2/",
    )
    wait_until(
        lambda: Delivery.objects.filter(kind="notice", state=DeliveryState.DELIVERED).exists(),
        timeout=30,
        message="a first notice delivered",
    )
    worker.kill()
    start_worker(procs, name="worker2")
    wait_state(rebind, RebindState.COMPLETED, timeout=90)
    notices = [r for r in slow.records() if r.header("x-a2a-event-kind") == "notice"]
    ids_per_task: dict[str, set[str]] = {}
    for record in notices:
        ids_per_task.setdefault(record.header("x-a2a-task-id"), set()).add(record.webhook_id)
    assert sorted(ids_per_task) == sorted(str(t.pk) for t in tasks)
    assert all(len(ids) == 1 for ids in ids_per_task.values())
    assert Delivery.objects.filter(kind="notice").count() == 12
    assert ChannelMove.objects.filter(rebind=rebind, state="moved").count() == 12


def test_a_scheduled_rebind_is_fired_by_beat(web, procs, tmp_path, agent):
    receiver = verifying_receiver(procs, web, agent, "channels")
    start_worker(procs)
    start_beat(procs)
    wait_workers_live(web.url)
    open_tasks(web, agent, receiver, 1)
    all_delivered()
    rebind = run_rebind(
        "schedule",
        agent.slug,
        "--move-prefix",
        f"{receiver.origin}/hooks/v1/",
        f"{receiver.origin}/hooks/v2/",
        "--at",
        "+3s",
    )
    assert rebind.state == RebindState.SCHEDULED
    rebind = wait_state(rebind, RebindState.COMPLETED, timeout=60)
    job = PeriodicTask.objects.get(name=f"rebind {rebind.pk}")
    assert job.one_off
    assert all(r.answer["status"] == 200 for r in receiver.records())


def test_a_client_reregistering_mid_task_is_moved_after_a_notice(web, procs, tmp_path, agent):
    receiver = verifying_receiver(procs, web, agent, "channels")
    start_worker(procs)
    start_beat(procs)
    wait_workers_live(web.url)
    [task] = open_tasks(web, agent, receiver, 1)
    all_delivered()
    answer = httpx.post(
        f"{web.url}/{agent.slug}/tasks/{task.pk}/pushNotificationConfigs",
        headers={"A2A-Version": "1.0"},
        json={"id": "cfg-0", "url": f"{receiver.origin}/hooks/v2/task-0"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    all_delivered()
    mine = by_task(receiver.records())[str(task.pk)]
    firsts = {}  # at least once: a retry repeats a webhook-id; its first arrival counts
    for record in mine:
        firsts.setdefault(record.webhook_id, record)
    kinds = [(r.path.rsplit("/", 2)[1], r.header("x-a2a-event-kind")) for r in firsts.values()]
    assert kinds == [
        ("v1", "snapshot"),
        ("v1", "status"),
        ("v1", "notice"),
        ("v2", "snapshot"),
        ("v2", "status"),
    ]
    assert all(r.answer["status"] == 200 for r in mine)
    [notice] = [r for r in firsts.values() if r.header("x-a2a-event-kind") == "notice"]
    payload = assert_strict_notice(notice, "channel-changed", card_jwks_url(agent, web_url=web.url))
    assert payload["newChannel"]["pathPrefix"] == "/hooks/v2/task-0"  # the one new URL's path
    rebind = Rebind.objects.get()
    assert wait_state(rebind, RebindState.COMPLETED).actor == "client anonymous"


def test_two_rebinds_racing_for_the_same_scope_open_one(agent, public_dns):
    prefix = "https://client.example.org/hooks/v1/"
    task_with_push(agent, f"{prefix}x", config_id="c")
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def start() -> None:
        from django.db import connection

        barrier.wait()
        try:
            rebind_start(
                RebindRequest(
                    agent=agent,
                    move_from=prefix,
                    move_to="https://client.example.org/hooks/v2/",
                    finish_on_old=True,
                ),
                actor="ops",
            )
            outcomes.append("opened")
        except RebindConflict:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["opened", "refused"]
    assert Rebind.objects.count() == 1


def test_a_deadline_reached_with_a_task_in_input_required_cuts_over_by_beat(
    web, procs, tmp_path, agent
):
    """finish-on-old keeps the INPUT_REQUIRED task on v1; nobody answers it, so beat's
    monitor alerts and, at the 4 s deadline, cuts it over: orphaned, with a final notice."""
    receiver = verifying_receiver(procs, web, agent, "channels")
    start_worker(procs)
    start_beat(procs)
    wait_workers_live(web.url)
    [task] = open_tasks(web, agent, receiver, 1)
    services.task_transition(task_id=task.pk, to_state=TaskState.INPUT_REQUIRED)
    all_delivered()
    rebind = run_rebind(
        "start",
        agent.slug,
        "--move-prefix",
        f"{receiver.origin}/hooks/v1/",
        f"{receiver.origin}/hooks/v2/",
        "--finish-on-old",
        "--deadline",
        "4s",
        "--on-timeout",
        "cutover",
    )
    rebind = wait_state(rebind, RebindState.CUT_OVER, timeout=30)
    all_delivered()
    alert = Alert.objects.get(kind=AlertKind.REBIND_DEADLINE, rebind=rebind)
    assert "100% of its deadline" in alert.message
    mine = by_task(receiver.records())[str(task.pk)]
    assert_strict_notice(mine[-1], "channel-orphaned", card_jwks_url(agent, web_url=web.url))
    assert mine[-1].path == "/hooks/v1/task-0"
    got = httpx.get(
        f"{web.url}/{agent.slug}/tasks/{task.pk}", headers={"A2A-Version": "1.0"}, timeout=10
    )
    assert got.json()["metadata"][URI]["orphaned"] is True


def test_an_aborted_drain_returns_unmoved_tasks_to_the_old_channel(
    web, procs, tmp_path, agent, receivers
):
    """The receiver refuses (503) while the drain starts, so no notice gets through; the
    operator aborts: the notices are withdrawn and the tasks' later events go to v1."""
    down = receivers.start(status=503)
    start_worker(procs)
    start_beat(procs)
    wait_workers_live(web.url)
    tasks = open_tasks(web, agent, down, 2)
    rebind = run_rebind(
        "start", agent.slug, "--move-prefix", f"{down.origin}/hooks/v1/", f"{down.origin}/hooks/v2/"
    )
    out = io.StringIO()
    call_command("rebind", "abort", str(rebind.pk), "--reason", "wrong prefix", stdout=out)
    assert "aborted" in out.getvalue()
    down.behave(status=200)
    for task in tasks:
        services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    all_delivered(timeout=90, ended=(DeliveryState.DELIVERED, DeliveryState.SUPERSEDED))
    withdrawn = Delivery.objects.filter(state=DeliveryState.SUPERSEDED)
    assert sorted(withdrawn.values_list("kind", flat=True)) == ["notice", "notice"]
    assert {d.last_error for d in withdrawn} == {f"rebind {rebind.pk} aborted"}
    paths = {r.path for r in down.records()}
    assert paths == {"/hooks/v1/task-0", "/hooks/v1/task-1"}
    kinds = {r.header("x-a2a-event-kind") for r in down.records() if r.answer["status"] == 200}
    assert "notice" not in kinds
    assert Rebind.objects.get(pk=rebind.pk).counts["reverted"] == 2


def test_a_command_in_a_second_shell_allows_the_receivers_the_platform_allows(
    transactional_db, tmp_path, monkeypatch, agent
):
    """The README's walk: the allowlist written once in `.env` (as `make run` writes it), read
    by the platform's web process and by `manage.py rebind start` in a second shell alike,
    neither of them with the variable in its environment."""
    dotenv = tmp_path / "dotenv"
    dotenv.write_text(f"A2A_WEBHOOK_ALLOWED_NETWORKS={ALLOWED}\n")
    monkeypatch.delenv("A2A_WEBHOOK_ALLOWED_NETWORKS", raising=False)
    monkeypatch.setenv("A2A_ENV_FILE", str(dotenv))
    origin = f"http://127.0.0.1:{live.free_port()}"
    web = live.start_web(tmp_path, name="web-dotenv")
    try:
        # The platform accepts a loopback receiver: SendMessage with an inline push config.
        live_open_task(web.url, agent, push={"id": "cfg", "url": f"{origin}/hooks/v1/task"})
    finally:
        web.stop()
    assert PushConfig.objects.filter(task__agent=agent).count() == 1

    def second_shell(*args: str, env_file) -> subprocess.CompletedProcess[str]:
        env = process_env(A2A_ENV_FILE=str(env_file))
        env.pop("A2A_WEBHOOK_ALLOWED_NETWORKS", None)
        return subprocess.run(
            [sys.executable, "manage.py", "rebind", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    move = ("start", agent.slug, "--move-prefix", f"{origin}/hooks/v1/", f"{origin}/hooks/v2/")
    # Without the line, the command refuses the loopback receiver, as the platform would.
    empty = tmp_path / "empty-dotenv"
    empty.write_text("")
    refused = second_shell(*move, env_file=empty)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "A2A_WEBHOOK_ALLOWED_NETWORKS" in refused.stderr
    assert not Rebind.objects.exists()
    # With it, the same command is accepted.
    done = second_shell(*move, "--no-wait", env_file=dotenv)
    assert done.returncode == 0, done.stdout + done.stderr
    rebind = Rebind.objects.get(pk=done.stdout.strip())
    assert rebind.move_to == f"{origin}/hooks/v2/"
