"""The `conformance` executor (tasks/executors/conformance.py) on a real Celery worker, driven
over JSON-RPC: its tasks stay WORKING (gettable, listable as working, cancelable) until a
client message says `complete`, `fail` or `input-required`, by its text or its metadata."""

from __future__ import annotations

import pytest

from tasks.models import Task
from tests.factories import AgentFactory, user_message
from tests.processes import wait_until
from tests.webhook_checks import start_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

V1 = {"A2A-Version": "1.0"}


@pytest.fixture
def agent(db):
    return AgentFactory(slug="tck", is_default=True, executor="conformance")


def send(wire, message: dict) -> dict:
    params = {"message": message, "configuration": {"returnImmediately": True}}
    answer = wire.rpc("SendMessage", params, headers=V1)
    return answer["result"]["task"]


def state_of(wire, task_id: str) -> str:
    return wire.rpc("GetTask", {"id": task_id}, headers=V1)["result"]["status"]["state"]


def wait_state(wire, task_id: str, state: str) -> None:
    wait_until(lambda: state_of(wire, task_id) == state, timeout=30, message=state)


def test_a_task_stays_working_until_told(wire, agent, procs):
    start_worker(procs)
    task = send(wire, user_message("Task for cancel test"))
    wait_state(wire, task["id"], "TASK_STATE_WORKING")
    # Still working after its message was handled: the echo artifact is there.
    wait_until(lambda: Task.objects.get(pk=task["id"]).artifacts.exists(), message="echo")
    assert state_of(wire, task["id"]) == "TASK_STATE_WORKING"
    listed = wire.rpc("ListTasks", {"contextId": task["contextId"]}, headers=V1)["result"]
    assert [t["status"]["state"] for t in listed["tasks"]] == ["TASK_STATE_WORKING"]

    # A follow-up that is not a command keeps it working; `complete` ends it.
    follow = {"taskId": task["id"], "contextId": task["contextId"]}
    send(wire, user_message("still there?", **follow))
    wait_until(lambda: Task.objects.get(pk=task["id"]).artifacts.count() == 2, message="2nd")
    assert state_of(wire, task["id"]) == "TASK_STATE_WORKING"
    send(wire, user_message("Complete", **follow))
    wait_state(wire, task["id"], "TASK_STATE_COMPLETED")


def test_cancel_ends_a_working_task(wire, agent, procs):
    start_worker(procs)
    task = send(wire, user_message("Task for cancel test"))
    wait_state(wire, task["id"], "TASK_STATE_WORKING")
    canceled = wire.rpc("CancelTask", {"id": task["id"]}, headers=V1)["result"]
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"


def test_metadata_or_text_asks_for_input_or_failure(wire, agent, procs):
    start_worker(procs)
    asked = send(wire, user_message("anything", metadata={"conformance": "input-required"}))
    failed = send(wire, user_message("fail"))
    wait_state(wire, asked["id"], "TASK_STATE_INPUT_REQUIRED")
    wait_state(wire, failed["id"], "TASK_STATE_FAILED")
    # The next message continues the interrupted task, WORKING again.
    send(wire, user_message("go on", taskId=asked["id"], contextId=asked["contextId"]))
    wait_state(wire, asked["id"], "TASK_STATE_WORKING")
