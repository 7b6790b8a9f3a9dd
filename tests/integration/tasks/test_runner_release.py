"""The runner's release after a run (tasks/executors/runner.py), on PostgreSQL and the ORM
store: a run whose last verb committed a terminal state has no claim left (that transaction
closed the dispatch) and is not released again; a run that leaves the task open is."""

import pytest

from tasks import services, task_store
from tasks.executors import runner
from tasks.models import DispatchState, ExecutorDispatch
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message
from tests.spies import Call, spy

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True, params=["postgres", "orm"])
def store(request, settings):
    settings.A2A_STORE = request.param
    return task_store.get_task_store()


@pytest.fixture
def releases(monkeypatch) -> list[Call]:
    """Every release the runner asks for, each still made (the real dispatch_finish runs)."""
    return spy(monkeypatch, runner, "dispatch_finish")


def _task_and_dispatch(executor: str, text: str = "hi"):
    agent = AgentFactory(executor=executor)
    task = task_create(agent=agent, owner="o", message=user_message(text))
    return task, ExecutorDispatch.objects.get(task=task)


def test_an_answered_task_is_not_released_again(releases):
    task, dispatch = _task_and_dispatch("echo")
    assert runner.run_dispatch(dispatch_id=dispatch.pk, worker="w1") == "done"
    task.refresh_from_db()
    dispatch.refresh_from_db()
    assert task.task_state == TaskState.COMPLETED
    # Closed by the answer's own transaction: done, no lease, nothing pending.
    assert dispatch.state == DispatchState.DONE
    assert dispatch.lease_expires_at is None
    assert releases == []
    # A late job for the same dispatch finds nothing to run.
    assert runner.run_dispatch(dispatch_id=dispatch.pk, worker="w2") == "skipped"


def test_a_run_that_leaves_its_task_working_is_released(releases):
    task, dispatch = _task_and_dispatch("conformance", "stay working")
    assert runner.run_dispatch(dispatch_id=dispatch.pk, worker="w1") == "done"
    task.refresh_from_db()
    dispatch.refresh_from_db()
    assert task.task_state == TaskState.WORKING
    assert [r.kwargs["worker"] for r in releases] == ["w1"]
    assert dispatch.state == DispatchState.DONE
    assert dispatch.lease_expires_at is None


def test_a_run_that_finishes_its_task_through_finish_is_not_released(releases):
    task, dispatch = _task_and_dispatch("conformance", "stay working")
    assert runner.run_dispatch(dispatch_id=dispatch.pk, worker="w1") == "done"
    # The client says "complete": a new dispatch, and the run finishes the task.
    services.task_send(
        agent=task.agent,
        owner="o",
        message=user_message("complete", taskId=str(task.pk)),
    )
    follow_up = ExecutorDispatch.objects.filter(task=task).exclude(pk=dispatch.pk).get()
    assert runner.run_dispatch(dispatch_id=follow_up.pk, worker="w2") == "done"
    task.refresh_from_db()
    follow_up.refresh_from_db()
    assert task.task_state == TaskState.COMPLETED
    assert follow_up.state == DispatchState.DONE
    assert [r.kwargs["worker"] for r in releases] == ["w1"]
