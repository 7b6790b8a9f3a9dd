"""Hosted a2a-sdk AgentExecutors (`python:<module>:<attribute>`) when things go wrong, with
real Celery worker and beat processes, driven over JSON-RPC as a client would (docs/agents.md,
"Semantics"):

- a CancelTask reaches the worker running `execute()`, which calls the executor's `cancel()`
  and then cancels `execute()`;
- a worker SIGKILLed mid-`execute()` loses nothing committed: its lease lapses, the sweeper
  re-enqueues the dispatch and another worker runs `execute()` again with the stored task as
  `current_task`; a dispatch's tries are its claims, so after A2A_DISPATCH_MAX_TRIES lost
  workers the task ends FAILED "executor lost", and waiting unclaimed is no try;
- an executor no worker can import keeps its agent's card 503 (readyz names the agent, the
  worker and the error) until a worker that can import it is live; the worker that cannot
  still says so.

The executors (tests/hosted_agents.py) append what they did to a marks file, with the name of
the worker that ran them: which process ran `execute()`, whether it was cancelled, and what a
re-run found in `current_task`. Short timings, given to the processes as env: leases of 3 s,
a sweep every second, unclaimed after 2 s, a heartbeat every second.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from agents.services import agent_create
from tasks.models import EventKind, TaskEvent
from tests.factories import user_message
from tests.hosted_agents import MARKS_FILE_ENV, WORKER_NAME_ENV
from tests.integration.protocol.conftest import Wire
from tests.integration.protocol.conftest import wire as protocol_wire  # noqa: F401 (fixture)
from tests.integration.tasks.test_hosted_executor import status_text, statuses
from tests.processes import ROOT, wait_until
from tests.readiness_helpers import readiness_reset

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

V1 = {"A2A-Version": "1.0"}
TEST_AGENTS = "python:tests.hosted_agents"
MAX_TRIES = 2
TIMINGS = {
    "A2A_DISPATCH_LEASE_SECONDS": "3",
    "A2A_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_DISPATCH_UNCLAIMED_SECONDS": "2",
    "A2A_DISPATCH_MAX_TRIES": str(MAX_TRIES),
}
# Long enough for a lease to lapse, the sweeper to re-enqueue and a new worker to start.
RECOVERY_TIMEOUT = 60


@pytest.fixture
def wire(protocol_wire):  # noqa: F811 (pytest passes the imported fixture)
    return protocol_wire


@pytest.fixture
def marks_file(tmp_path) -> Path:
    return tmp_path / "marks.jsonl"


def start_beat(procs):
    """Beat firing the dispatch sweeper and the worker heartbeat every second."""
    with override_settings(A2A_SWEEP_INTERVAL_SECONDS=1, A2A_HEARTBEAT_INTERVAL_SECONDS=1):
        call_command("sync_schedules", stdout=io.StringIO())
    return procs.beat(**TIMINGS)


def start_worker(
    procs, name: str, marks_file: Path, *, queues: str = "agents,webhooks,heartbeat", **env: str
):
    """A worker as run_platform starts one (the threads pool), the project root on its
    PYTHONPATH (the test executors' home), writing its executors' marks as `name`."""
    return procs.worker(
        name=name,
        queues=queues,
        pool="threads",
        concurrency=4,
        **{
            "PYTHONPATH": str(ROOT),
            MARKS_FILE_ENV: str(marks_file),
            WORKER_NAME_ENV: name,
            **TIMINGS,
            **env,
        },
    )


def hosted(attribute: str, slug: str = "hosted"):
    return agent_create(
        slug=slug,
        name="Hosted",
        description="an a2a-sdk AgentExecutor",
        executor=f"{TEST_AGENTS}:{attribute}",
        is_default=True,
    )


def send(wire, text: str) -> dict:
    params = {"message": user_message(text), "configuration": {"returnImmediately": True}}
    answer = wire.rpc("SendMessage", params, headers=V1)
    assert "result" in answer, answer
    return answer["result"]["task"]


def get_task(wire, task_id: str) -> dict:
    answer = wire.rpc("GetTask", {"id": task_id}, headers=V1)
    assert "result" in answer, answer
    return answer["result"]


def wait_state(wire, task_id: str, state: str, timeout: float = 30) -> dict:
    def reached():
        task = get_task(wire, task_id)
        return task if task["status"]["state"] == f"TASK_STATE_{state}" else None

    return wait_until(reached, timeout=timeout, interval=0.1, message=f"task {state}")


def marks(marks_file: Path, event: str | None = None) -> list[dict]:
    """What the executors marked, in order (tests/hosted_agents.py `mark`)."""
    if not marks_file.exists():
        return []
    lines = [json.loads(line) for line in marks_file.read_text().splitlines() if line]
    return [m for m in lines if event is None or m["event"] == event]


def wait_marks(marks_file: Path, event: str, count: int, timeout: float = 30) -> list[dict]:
    return wait_until(
        lambda: (found := marks(marks_file, event)) and len(found) >= count and found,
        timeout=timeout,
        message=f"{count} {event!r} marks",
    )


def agents_queue_length() -> int:
    """Announcements waiting on `agents` (Redis keeps a queue as a list of that name)."""
    return redis.Redis.from_url(settings.CELERY_BROKER_URL).llen("agents")


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_reaches_the_worker_running_execute_which_calls_cancel_then_stops_it(
    wire, procs, marks_file
):
    for name in ("left", "right"):
        start_worker(procs, name, marks_file)
    hosted("Hangs")
    task_id = send(wire, "wait for me")["id"]
    (started,) = wait_marks(marks_file, "execute", 1)
    assert started["worker"] in ("left", "right")
    wait_state(wire, task_id, "WORKING")

    canceled = wire.rpc("CancelTask", {"id": task_id}, headers=V1)["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"

    wait_marks(marks_file, "execute cancelled", 1)
    # The SDK server's order: cancel() first, then execute() cancelled; both in the process
    # that ran execute(), which the web answering CancelTask never knew.
    assert [m["event"] for m in marks(marks_file)] == ["execute", "cancel", "execute cancelled"]
    ran_in = {(m["worker"], m["pid"]) for m in marks(marks_file)}
    assert ran_in == {(started["worker"], started["pid"])}
    assert get_task(wire, task_id)["status"]["state"] == "TASK_STATE_CANCELED"
    assert statuses(task_id) == ["submitted", "working", "canceled"]


# --- a worker killed mid-execute() ------------------------------------------------------------


def test_a_run_killed_mid_execute_runs_again_on_another_worker_from_the_stored_task(
    wire, procs, marks_file
):
    start_beat(procs)
    first = start_worker(procs, "first", marks_file)
    hosted("ResumesFromTheStoredTask")
    task_id = send(wire, "write the report")["id"]
    wait_marks(marks_file, "first chunk committed", 1)

    first.kill()  # SIGKILL: no shutdown, no release; only the lease can tell
    stored = get_task(wire, task_id)
    assert stored["status"]["state"] == "TASK_STATE_WORKING"
    assert [p["text"] for p in stored["artifacts"][0]["parts"]] == ["part 1"]

    start_worker(procs, "second", marks_file)
    done = wait_state(wire, task_id, "COMPLETED", timeout=RECOVERY_TIMEOUT)

    runs = [(m["worker"], m["state"], m["artifacts"]) for m in marks(marks_file, "execute")]
    assert runs == [
        ("first", "TASK_STATE_SUBMITTED", {}),
        # The re-run's current_task is what the dead run committed: WORKING, the first chunk.
        ("second", "TASK_STATE_WORKING", {"report": ["part 1"]}),
    ]
    (artifact,) = done["artifacts"]
    assert artifact["artifactId"] == "report"
    assert [p["text"] for p in artifact["parts"]] == ["part 1", "part 2"]
    assert statuses(task_id) == ["submitted", "working", "completed"]
    chunks = TaskEvent.objects.filter(task_id=task_id, kind=EventKind.ARTIFACT).count()
    assert chunks == 2, "a chunk was written twice"


def test_a_task_whose_workers_keep_dying_fails_executor_lost_after_its_tries(
    wire, procs, marks_file
):
    """Each run's worker is killed mid-`execute()`; after MAX_TRIES lost claims the sweeper
    (on a worker of its own that runs no task) fails the task, readably."""
    start_beat(procs)
    start_worker(procs, "sweeper", marks_file, queues="heartbeat")
    hosted("Hangs")
    task_id = send(wire, "never answers")["id"]

    for run, name in enumerate(("first", "second"), start=1):
        worker = start_worker(procs, name, marks_file, queues="agents")
        wait_marks(marks_file, "execute", run, timeout=RECOVERY_TIMEOUT)
        worker.kill()

    failed = wait_state(wire, task_id, "FAILED", timeout=RECOVERY_TIMEOUT)
    assert status_text(failed).startswith("executor lost")
    assert [m["worker"] for m in marks(marks_file, "execute")] == ["first", "second"]
    assert statuses(task_id) == ["submitted", "working", "failed"]


def test_waiting_unclaimed_between_lost_workers_is_no_try(wire, procs, marks_file):
    """After the first worker dies nobody consumes `agents` for a while: the sweeper
    re-enqueues the lapsed dispatch (a try) and then announces it again while it waits (no
    try). The next worker still runs it, and only its death uses up the tries."""
    start_beat(procs)
    start_worker(procs, "sweeper", marks_file, queues="heartbeat")
    hosted("Hangs")
    task_id = send(wire, "never answers")["id"]
    first = start_worker(procs, "first", marks_file, queues="agents")
    wait_marks(marks_file, "execute", 1)
    first.kill()

    # The lapse's re-enqueue, then two announcements of a dispatch waiting unclaimed.
    wait_until(lambda: agents_queue_length() >= 3, timeout=RECOVERY_TIMEOUT, message="waiting")
    assert get_task(wire, task_id)["status"]["state"] == "TASK_STATE_WORKING"

    second = start_worker(procs, "second", marks_file, queues="agents")
    wait_marks(marks_file, "execute", 2, timeout=RECOVERY_TIMEOUT)
    second.kill()

    failed = wait_state(wire, task_id, "FAILED", timeout=RECOVERY_TIMEOUT)
    assert status_text(failed).startswith("executor lost")
    assert [m["worker"] for m in marks(marks_file, "execute")] == ["first", "second"]


# --- an executor that cannot be imported ------------------------------------------------------
# The agent's code lives in a folder of its own, as a team's agent package does, importable
# only from a PYTHONPATH naming that folder. (The project root would not do: the workers start
# in it, and Celery's Django fixup puts the working directory first on sys.path, so a module
# beside manage.py imports with or without PYTHONPATH.)
AGENT_MODULE = "separately_installed_agent"
AGENT_SPEC = f"python:{AGENT_MODULE}:OutsideExecutor"
AGENT_CODE = """
from a2a.server.agent_execution import AgentExecutor


class OutsideExecutor(AgentExecutor):
    async def execute(self, context, event_queue):
        return None

    async def cancel(self, context, event_queue):
        return None
"""


@pytest.fixture
def agent_folder(tmp_path) -> Path:
    folder = tmp_path / "agent_code"
    folder.mkdir()
    (folder / f"{AGENT_MODULE}.py").write_text(AGENT_CODE)
    return folder


@pytest.fixture
def real_wire(transactional_db):
    """The protocol app with no faked worker rows: readiness is what the real processes
    wrote."""
    readiness_reset()
    yield Wire()
    readiness_reset()


def card(wire: Wire, slug: str):
    return wire.request("GET", f"/{slug}/.well-known/agent-card.json")


def test_an_executor_no_worker_can_import_keeps_its_card_back_until_one_can(
    real_wire, procs, marks_file, agent_folder
):
    agent_create(
        slug="outside",
        name="Outside",
        description="an a2a-sdk AgentExecutor from its own folder",
        executor=AGENT_SPEC,
    )
    start_beat(procs)
    start_worker(procs, "without", marks_file)
    missing = f"ModuleNotFoundError: No module named '{AGENT_MODULE}'"
    last: dict = {}

    def refused_naming_the_import_error():
        answer = last["card"] = card(real_wire, "outside")
        why = answer.json().get("failing", {}).get("hosted_executor", "")
        return answer.status_code == 503 and "without@" in why and answer

    try:
        refused = wait_until(refused_naming_the_import_error, message="card refused")
    except TimeoutError as timeout:
        answer = last["card"]
        raise AssertionError(f"the card answered {answer.status_code} {answer.text}") from timeout
    assert refused.headers["Retry-After"]
    why = refused.json()["failing"]["hosted_executor"]
    assert why.startswith(f"{AGENT_SPEC}: no live worker can load it")
    assert missing in why

    ready = real_wire.request("GET", "/readyz")
    assert ready.status_code == 200, ready.text  # one agent's code keeps back its card only
    report = ready.json()["hosted"][AGENT_SPEC]
    assert (report["ok"], report["agents"], report["loadsOn"]) == (False, ["outside"], [])
    ((host, reason),) = report["failsOn"].items()
    assert host.startswith("without@")
    assert reason == missing

    start_worker(procs, "with", marks_file, PYTHONPATH=f"{agent_folder}:{ROOT}")
    served = wait_until(
        lambda: (answer := card(real_wire, "outside")).status_code == 200 and answer,
        message="card served once a worker loads the executor",
    )
    assert served.json()["name"] == "Outside"
    report = real_wire.request("GET", "/readyz").json()["hosted"][AGENT_SPEC]
    assert report["ok"]
    assert [host.split("@")[0] for host in report["loadsOn"]] == ["with"]
    # The worker that cannot load it still says so: a card needs one live worker that can.
    assert [host.split("@")[0] for host in report["failsOn"]] == ["without"]
