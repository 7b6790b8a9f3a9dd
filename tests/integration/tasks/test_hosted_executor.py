"""Hosted a2a-sdk AgentExecutors (`python:<module>:<attribute>`, tasks/executors/hosted.py) on
a real Celery worker process, driven over JSON-RPC as a client would: the example currency
agent (examples/currency_agent) streams, asks for input and is canceled; executors that raise
or send invalid events end their tasks FAILED, visibly.

The agent is created through the service `create_agent` calls; the worker imports the agents'
code from its PYTHONPATH (the project root).
"""

from __future__ import annotations

import json

import pytest

from agents.services import agent_create
from tasks.models import Artifact, EventKind, Task, TaskEvent
from tasks.states import TaskState
from tests.factories import user_message
from tests.integration.protocol.conftest import wire as protocol_wire  # noqa: F401 (fixture)
from tests.processes import ROOT, wait_until
from tests.webhook_checks import start_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

V1 = {"A2A-Version": "1.0"}
CURRENCY = "python:examples.currency_agent.agent:CurrencyAgentExecutor"
TEST_AGENTS = "python:tests.hosted_agents"


@pytest.fixture(scope="module")
def worker(module_procs):
    return start_worker(module_procs, name="hosted", PYTHONPATH=str(ROOT))


@pytest.fixture
def wire(protocol_wire):  # noqa: F811 (pytest passes the imported fixture)
    return protocol_wire


def hosted(executor: str):
    return agent_create(
        slug="hosted",
        name="Hosted",
        description="an a2a-sdk AgentExecutor",
        executor=executor,
        is_default=True,
    )


def send(wire, message: dict, *, blocking: bool = False) -> dict:
    params: dict = {"message": message}
    if not blocking:
        params["configuration"] = {"returnImmediately": True}
    answer = wire.rpc("SendMessage", params, headers=V1)
    assert "result" in answer, answer
    return answer["result"]


def get_task(wire, task_id: str) -> dict:
    return wire.rpc("GetTask", {"id": task_id}, headers=V1)["result"]


def wait_state(wire, task_id: str, state: str) -> dict:
    def settled():
        task = get_task(wire, task_id)
        return task if task["status"]["state"] == f"TASK_STATE_{state}" else None

    return wait_until(settled, timeout=30, interval=0.1, message=state)


def statuses(task_id: str) -> list[str]:
    return [
        TaskState(e.payload["statusUpdate"]["status"]["state"]).short
        for e in TaskEvent.objects.filter(task_id=task_id, kind=EventKind.STATUS).order_by("seq")
    ]


def status_text(task: dict) -> str:
    return task["status"]["message"]["parts"][0]["text"]


def test_the_currency_agent_streams_an_artifact_in_two_chunks_and_completes(wire, worker):
    hosted(CURRENCY)
    task = send(wire, user_message("100 USD to EUR"))["task"]
    done = wait_state(wire, task["id"], "COMPLETED")

    assert statuses(task["id"]) == ["submitted", "working", "completed"]
    kinds = TaskEvent.objects.filter(task_id=task["id"]).order_by("seq")
    assert [e.kind for e in kinds] == ["status", "status", "artifact", "artifact", "status"]
    first, second = [e.payload["artifactUpdate"] for e in kinds if e.kind == EventKind.ARTIFACT]
    assert "append" not in first
    assert "lastChunk" not in first
    assert second["append"] is True
    assert second["lastChunk"] is True
    (artifact,) = done["artifacts"]
    assert artifact["name"] == "conversion"
    assert [p["text"] for p in artifact["parts"]] == ["100 USD = ", "92.00 EUR"]
    row = Artifact.objects.get(task_id=task["id"])
    assert (row.chunks, row.complete) == (2, True)
    assert status_text(done) == "100 USD is 92.00 EUR."
    assert [m["role"] for m in done["history"]] == ["ROLE_USER"]


def test_input_required_returns_control_and_the_next_message_runs_execute_again(wire, worker):
    # A zero-argument callable returning the executor, the spec's other form.
    hosted(f"{TEST_AGENTS}:currency_factory")
    task = send(wire, user_message("100 USD"))["task"]
    asked = wait_state(wire, task["id"], "INPUT_REQUIRED")
    assert status_text(asked).startswith("Which currency should I convert 100 USD to?")

    follow = user_message("EUR", taskId=task["id"], contextId=task["contextId"])
    send(wire, follow)
    done = wait_state(wire, task["id"], "COMPLETED")
    assert statuses(task["id"]) == [
        "submitted",
        "working",
        "input-required",
        "working",
        "completed",
    ]
    assert [p["text"] for p in done["artifacts"][0]["parts"]] == ["100 USD = ", "92.00 EUR"]
    assert [m["parts"][0]["text"] for m in done["history"]] == ["100 USD", "EUR"]


def test_a_direct_message_answer_is_the_send_message_result(wire, worker):
    hosted(f"{TEST_AGENTS}:DirectAnswer")
    answer = send(wire, user_message("hi"), blocking=True)
    assert answer["message"]["parts"] == [{"text": "you said: hi"}]
    assert answer["message"]["role"] == "ROLE_AGENT"
    task = Task.objects.get()
    assert task.task_state == TaskState.COMPLETED
    assert task.answered_with_message


def test_an_exception_in_execute_fails_the_task_readably_without_the_trace(
    wire, worker, admin_client
):
    hosted(f"{TEST_AGENTS}:Raising")
    task = send(wire, user_message("go"))["task"]
    failed = wait_state(wire, task["id"], "FAILED")

    assert status_text(failed) == "The agent failed: RuntimeError."
    assert "secret" not in json.dumps(failed)
    assert statuses(task["id"]) == ["submitted", "working", "failed"]
    worker.wait_for_log("rate service down at postgres://secret@db/rates")
    assert "Traceback" in worker.log()
    # The whole trace is the operators': on the task's page in the console.
    page = admin_client.get(f"/admin/tasks/task/{task['id']}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Traceback (most recent call last)" in html
    assert "RuntimeError: rate service down at postgres://secret@db/rates" in html


def test_an_execute_that_returns_leaving_the_task_working_fails_it_visibly(wire, worker):
    hosted(f"{TEST_AGENTS}:ReturnsEarly")
    task = send(wire, user_message("go"))["task"]
    failed = wait_state(wire, task["id"], "FAILED")

    assert status_text(failed) == "The agent stopped without finishing the task (left working)."
    assert statuses(task["id"]) == ["submitted", "working", "failed"]


@pytest.mark.parametrize(
    ("what", "reason"),
    [
        ("other-task", "an event for task 'not-this-task', not this run's"),
        ("illegal-move", "illegal transition: working cannot move to submitted"),
        ("unknown-append", "an append to unknown artifact 'never-started'"),
    ],
)
def test_an_invalid_event_is_refused_and_the_task_fails(wire, worker, what, reason):
    hosted(f"{TEST_AGENTS}:Misbehaving")
    task = send(wire, user_message(what))["task"]
    failed = wait_state(wire, task["id"], "FAILED")

    assert reason in status_text(failed)
    assert status_text(failed).startswith("The agent sent an invalid event: ")
    # Refused, then nothing after it is written: no completion, no artifact.
    assert statuses(task["id"]) == ["submitted", "working", "failed"]
    assert not Artifact.objects.filter(task_id=task["id"]).exists()
    worker.wait_for_log(f"hosted executor event refused: {reason}")


def test_cancel_while_execute_runs_calls_cancel_and_ends_canceled(wire, worker):
    hosted(CURRENCY)
    task = send(wire, user_message("100 USD to EUR, slowly"))["task"]
    wait_state(wire, task["id"], "WORKING")

    canceled = wire.rpc("CancelTask", {"id": task["id"]}, headers=V1)["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    # The running execute() hears of it: its executor's cancel() is called, execute() stops.
    worker.wait_for_log(f"currency agent: cancel of task {task['id']}")
    worker.wait_for_log("task finished while its hosted executor ran; canceling it")
    assert statuses(task["id"]) == ["submitted", "working", "canceled"]
    assert not Artifact.objects.filter(task_id=task["id"]).exists()
