"""The host of hosted runs (tasks/executors/host.py) in this process, on the test database:
runs do not hold the job that announced them, many wait on the loop at once, runs writing
together do not pay for each other's refused events, a full host leaves dispatches waiting
(their tasks SUBMITTED) and claims them as slots free, and the sweeper never fails a hosted
task for waiting, only for leases its workers lost; a stopping worker hands its runs back.

The jobs' own path (`Host.take`, what tasks/jobs.py calls) is driven from the test's thread;
the executors below are imported by the host from this module."""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta

import pytest
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Part
from django.utils import timezone

from agents.services import agent_create
from tasks.dispatch import dispatch_claim
from tasks.executors.host import Host
from tasks.models import DispatchState, ExecutorDispatch, Task
from tasks.states import TaskState
from tasks.sweeper import EXECUTOR_LOST_MESSAGE, dispatch_sweep
from tests.processes import ROOT, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MODULE = "python:tests.integration.tasks.test_hosted_host"
V1 = {"A2A-Version": "1.0"}


class _Gauge:
    """How many `execute()`s are in flight now, and the most at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


IN_FLIGHT = _Gauge()


class AwaitsASecond(AgentExecutor):
    """A model call's shape: WORKING, one second awaited, an artifact, COMPLETED."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        with IN_FLIGHT:
            updater = TaskUpdater(event_queue, context.task_id, context.context_id)
            await updater.start_work()
            await asyncio.sleep(1)
            await updater.add_artifact([Part(text="done")], name="answer")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


class AwaitsThenStrays(AgentExecutor):
    """Awaits as long as the others, then sends an event for another task: refused."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).start_work()
        await asyncio.sleep(1)
        stray = TaskUpdater(event_queue, "another-task", context.context_id)
        await stray.add_artifact([Part(text="not yours")], name="stray")

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


class ResumesAfterHandBack(AgentExecutor):
    """The first run commits an artifact, then awaits far longer than any test; a run that
    finds that artifact in `current_task` completes (a resume, as docs/agents.md advises)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if any(a.artifact_id == "first" for a in context.current_task.artifacts):
            await updater.complete()
            return
        await updater.start_work()
        await updater.add_artifact([Part(text="begun")], artifact_id="first", name="first")
        await asyncio.sleep(600)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


@pytest.fixture(autouse=True)
def _fresh_gauge():
    IN_FLIGHT.now = IN_FLIGHT.most = 0


@pytest.fixture
def agent():
    return agent_create(
        slug="hosted-host",
        name="Hosted",
        description="awaits a second",
        executor=f"{MODULE}:AwaitsASecond",
    )


def open_tasks(agent, count: int) -> list[Task]:
    """`count` tasks sent as a client sends them: SendMessage over JSON-RPC, returning at once
    (the in-process ASGI app; no worker: the test's host takes them)."""
    # Imported here: worker processes import this module for its executors, not the web app.
    from tests.integration.protocol.conftest import Wire

    wire, opened = Wire(), []
    for n in range(count):
        message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": f"#{n}"}]}
        params = {"message": message, "configuration": {"returnImmediately": True}}
        answer = wire.rpc("SendMessage", params, path=f"/{agent.slug}", headers=V1)
        assert "result" in answer, answer
        opened.append(Task.objects.get(pk=answer["result"]["task"]["id"]))
    return opened


def dispatch_id(task: Task) -> int:
    return (
        ExecutorDispatch.objects.filter(task=task).order_by("-id").values_list("pk", flat=True)[0]
    )


def states(tasks: list[Task]) -> list[str]:
    return [TaskState(Task.objects.get(pk=t.pk).state).short for t in tasks]


def wait_all(tasks: list[Task], state: str, timeout: float = 30) -> None:
    wait_until(lambda: set(states(tasks)) == {state}, timeout=timeout, message=state)


def test_fifty_runs_wait_on_the_loop_at_once_and_their_jobs_return_at_once(agent, settings):
    settings.A2A_HOSTED_CONCURRENCY = 200
    tasks = open_tasks(agent, 50)
    host = Host()
    outcomes = [host.take(dispatch_id=dispatch_id(t), worker="w:job") for t in tasks]
    # Each job returned before its run's second was over: the runs are the loop's.
    assert outcomes == ["started"] * 50
    assert host.in_flight == 50
    wait_all(tasks, "completed")
    assert IN_FLIGHT.most == 50
    wait_until(lambda: host.in_flight == 0, timeout=5)


def test_one_runs_refused_event_costs_the_runs_writing_beside_it_nothing(agent, settings):
    """Runs that write at the same moment share a transaction; one whose event is refused
    fails alone, and the others' events are all written."""
    stray = agent_create(
        slug="strays",
        name="Strays",
        description="writes for another task",
        executor=f"{MODULE}:AwaitsThenStrays",
    )
    tasks = open_tasks(agent, 10)
    strays = open_tasks(stray, 3)
    host = Host()
    for task in [*tasks[:5], *strays, *tasks[5:]]:
        assert host.take(dispatch_id=dispatch_id(task), worker="w:job") == "started"
    wait_all(tasks, "completed")
    wait_all(strays, "failed")
    for task in tasks:
        assert task.artifacts.get().parts == [{"text": "done"}]
    for task in strays:
        assert not task.artifacts.exists()
        text = Task.objects.get(pk=task.pk).status_message["parts"][0]["text"]
        assert text.startswith("The agent sent an invalid event: an event for task 'another-task'")


def test_a_full_host_leaves_tasks_submitted_and_claims_them_as_slots_free(agent, settings):
    settings.A2A_HOSTED_CONCURRENCY = 2
    tasks = open_tasks(agent, 5)
    host = Host()
    outcomes = [host.take(dispatch_id=dispatch_id(t), worker="w:job") for t in tasks]
    assert outcomes == ["started", "started", "waiting", "waiting", "waiting"]
    waiting = tasks[2:]
    # Visibly waiting: SUBMITTED, their dispatches PENDING and unclaimed.
    assert states(waiting) == ["submitted"] * 3
    assert {d.state for d in ExecutorDispatch.objects.filter(task__in=waiting)} == {
        DispatchState.PENDING
    }
    wait_all(tasks, "completed")
    assert IN_FLIGHT.most == 2


def test_waiting_for_a_slot_never_counts_as_a_try(agent, settings):
    """A hosted dispatch nobody claims is announced again on every sweep, and its task
    stays SUBMITTED however often (a built-in's would fail after A2A_DISPATCH_MAX_TRIES)."""
    [task] = open_tasks(agent, 1)
    later = timezone.now()
    for _ in range(settings.A2A_DISPATCH_MAX_TRIES + 2):
        later += timedelta(seconds=settings.A2A_DISPATCH_UNCLAIMED_SECONDS + 1)
        assert dispatch_sweep(now=later).re_enqueued == 1
    dispatch = ExecutorDispatch.objects.get(pk=dispatch_id(task))
    assert dispatch.state == DispatchState.PENDING
    assert states([task]) == ["submitted"]


def test_leases_lost_by_its_workers_are_the_tries(agent, settings):
    """Each claim whose lease lapsed (its worker gone) is a try; after the last, the task
    fails readably. Leases of 0 s: each has lapsed by the sweep that follows its claim."""
    settings.A2A_DISPATCH_LEASE_SECONDS = 0
    [task] = open_tasks(agent, 1)
    tries = settings.A2A_DISPATCH_MAX_TRIES
    for attempt in range(1, tries + 1):
        assert dispatch_claim(dispatch_id=dispatch_id(task), worker=f"gone:{attempt}")
        swept = dispatch_sweep()
        expected = (1, 0) if attempt < tries else (0, 1)
        assert (swept.re_enqueued, swept.failed_tasks) == expected
    failed = Task.objects.get(pk=task.pk)
    assert failed.task_state == TaskState.FAILED
    assert failed.status_message["parts"][0]["text"] == EXECUTOR_LOST_MESSAGE.format(tries=tries)


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_stopping_worker_hands_its_runs_back_to_run_elsewhere_at_once(procs, pool):
    """A warm shutdown (SIGTERM, as a rolling deploy sends) gives the runs their grace, then
    releases them due at once: the next worker runs them again from the stored task, and no
    lease had to lapse (no try was used)."""
    agent = agent_create(
        slug="hands-back",
        name="Hands back",
        description="resumes",
        executor=f"{MODULE}:ResumesAfterHandBack",
    )
    env = {"PYTHONPATH": str(ROOT), "A2A_HOSTED_SHUTDOWN_GRACE_SECONDS": "1"}
    first = procs.worker(name="first", queues="agents", pool=pool, **env)
    [task] = open_tasks(agent, 1)
    wait_until(lambda: task.artifacts.filter(artifact_id="first").exists(), timeout=30)
    first.stop(timeout=30)
    assert first.popen.returncode is not None
    assert "handing back 1 hosted runs" in first.log()
    dispatch = ExecutorDispatch.objects.get(pk=dispatch_id(task))
    assert (dispatch.state, dispatch.claims) == (DispatchState.PENDING, 1)
    assert states([task]) == ["working"]

    procs.worker(name="second", queues="agents", pool=pool, **env)
    wait_all([task], "completed")
    assert list(task.artifacts.values_list("artifact_id", flat=True)) == ["first"]
