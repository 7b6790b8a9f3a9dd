"""Claiming and releasing executor dispatches through both task stores.

tasks/dispatch.py's dispatch_claim and dispatch_finish run one prepared statement (claim) and
two (release) on PostgreSQL, and the ORM twin elsewhere (the embedded SQLite database): each
test runs through both (tasks/task_store/'s switch).
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks import services, task_store
from tasks.dispatch import dispatch_claim, dispatch_finish
from tasks.models import DispatchState, ExecutorDispatch, Task
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message

pytestmark = pytest.mark.django_db

S = TaskState


@pytest.fixture(autouse=True, params=["postgres", "orm"])
def store(request, settings):
    settings.A2A_STORE = request.param
    expected = {"postgres": task_store.PgTaskStore, "orm": task_store.OrmTaskStore}
    assert type(task_store.get_task_store()) is expected[request.param]
    return request.param


def open_dispatch(agent) -> ExecutorDispatch:
    task = task_create(agent=agent, owner="o", message=user_message("hi"))
    return task.dispatches.get()


def test_claim_takes_a_due_pending_dispatch_once(agent):
    dispatch = open_dispatch(agent)
    claim = dispatch_claim(dispatch_id=dispatch.pk, worker="w1")
    assert claim is not None
    assert claim.task_id == str(dispatch.task_id)
    assert claim.executor == agent.executor
    assert claim.progress == {}
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.CLAIMED
    assert dispatch.claims == 1
    assert dispatch.claimed_by == "w1"
    assert dispatch.lease_expires_at == claim.lease_expires_at
    assert dispatch.lease_expires_at > timezone.now()
    assert dispatch_claim(dispatch_id=dispatch.pk, worker="w2") is None
    dispatch.refresh_from_db()
    assert (dispatch.claimed_by, dispatch.claims) == ("w1", 1)


def test_claim_hands_over_the_stored_progress(agent):
    dispatch = open_dispatch(agent)
    ExecutorDispatch.objects.filter(pk=dispatch.pk).update(progress={"pc": 3})
    assert dispatch_claim(dispatch_id=dispatch.pk, worker="w").progress == {"pc": 3}


def test_claim_leaves_a_dispatch_not_yet_due(agent):
    dispatch = open_dispatch(agent)
    later = timezone.now() + timedelta(seconds=60)
    ExecutorDispatch.objects.filter(pk=dispatch.pk).update(not_before=later)
    assert dispatch_claim(dispatch_id=dispatch.pk, worker="w") is None
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.PENDING
    assert dispatch.claims == 0


def test_claim_of_an_unknown_dispatch_is_none():
    assert dispatch_claim(dispatch_id=987654321, worker="w") is None


def test_claim_marks_the_dispatch_of_a_terminal_task_done(agent):
    dispatch = open_dispatch(agent)
    Task.objects.filter(pk=dispatch.task_id).update(state=S.COMPLETED.value)
    assert dispatch_claim(dispatch_id=dispatch.pk, worker="w") is None
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.DONE
    assert (dispatch.claims, dispatch.claimed_by, dispatch.lease_expires_at) == (0, "", None)


def test_finish_releases_the_claim_done_with_its_progress(
    agent, django_capture_on_commit_callbacks
):
    dispatch = open_dispatch(agent)
    dispatch_claim(dispatch_id=dispatch.pk, worker="w")
    with django_capture_on_commit_callbacks() as callbacks:
        assert dispatch_finish(dispatch_id=dispatch.pk, worker="w", progress={"pc": 2})
    assert callbacks == []
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.DONE
    assert dispatch.lease_expires_at is None
    assert dispatch.progress == {"pc": 2}


def test_finish_without_progress_keeps_the_stored_one(agent):
    dispatch = open_dispatch(agent)
    ExecutorDispatch.objects.filter(pk=dispatch.pk).update(progress={"pc": 1})
    dispatch_claim(dispatch_id=dispatch.pk, worker="w")
    assert dispatch_finish(dispatch_id=dispatch.pk, worker="w")
    dispatch.refresh_from_db()
    assert dispatch.progress == {"pc": 1}
    assert dispatch.state == DispatchState.DONE


def test_finish_run_again_keeps_the_eta_and_publishes_one_job(
    agent, django_capture_on_commit_callbacks
):
    dispatch = open_dispatch(agent)
    dispatch_claim(dispatch_id=dispatch.pk, worker="w")
    before = timezone.now()
    with django_capture_on_commit_callbacks() as callbacks:
        assert dispatch_finish(dispatch_id=dispatch.pk, worker="w", run_again_after=30)
    assert len(callbacks) == 1
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.PENDING
    assert dispatch.enqueues == 1
    assert dispatch.lease_expires_at is None
    assert before + timedelta(seconds=30) <= dispatch.not_before
    assert dispatch.not_before <= timezone.now() + timedelta(seconds=30)


def test_finish_run_again_of_a_terminal_task_is_done(agent, django_capture_on_commit_callbacks):
    dispatch = open_dispatch(agent)
    dispatch_claim(dispatch_id=dispatch.pk, worker="w")
    Task.objects.filter(pk=dispatch.task_id).update(state=S.CANCELED.value)
    with django_capture_on_commit_callbacks() as callbacks:
        assert dispatch_finish(dispatch_id=dispatch.pk, worker="w", run_again_after=30)
    assert callbacks == []
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.DONE


def test_finish_after_a_client_answer_during_the_run_is_pending_now(
    agent, django_capture_on_commit_callbacks
):
    dispatch = open_dispatch(agent)
    dispatch_claim(dispatch_id=dispatch.pk, worker="w")
    task_id = dispatch.task_id
    services.task_transition(task_id=task_id, to_state=S.WORKING)
    services.task_transition(task_id=task_id, to_state=S.INPUT_REQUIRED, message="more?")
    services.task_append_message(task_id=task_id, message=user_message("answer"))
    assert Task.objects.get(pk=task_id).dispatches.count() == 1  # the claim was still active
    before = timezone.now()
    with django_capture_on_commit_callbacks() as callbacks:
        assert dispatch_finish(dispatch_id=dispatch.pk, worker="w", progress={"pc": 1})
    assert len(callbacks) == 1
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.PENDING
    assert dispatch.enqueues == 1
    assert before <= dispatch.not_before <= timezone.now()
    assert dispatch.progress == {"pc": 1}


def test_finish_of_a_task_waiting_for_input_without_an_answer_is_done(agent):
    dispatch = open_dispatch(agent)
    dispatch_claim(dispatch_id=dispatch.pk, worker="w")
    services.task_transition(task_id=dispatch.task_id, to_state=S.WORKING)
    services.task_append_message(
        task_id=dispatch.task_id, message=user_message("before the question")
    )
    services.task_transition(task_id=dispatch.task_id, to_state=S.INPUT_REQUIRED, message="?")
    assert dispatch_finish(dispatch_id=dispatch.pk, worker="w")
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.DONE


def test_finish_by_another_worker_changes_nothing(agent):
    dispatch = open_dispatch(agent)
    claim = dispatch_claim(dispatch_id=dispatch.pk, worker="w1")
    assert not dispatch_finish(dispatch_id=dispatch.pk, worker="w2", progress={"x": 1})
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.CLAIMED
    assert dispatch.claimed_by == "w1"
    assert dispatch.lease_expires_at == claim.lease_expires_at
    assert dispatch.progress == {}


def test_finish_of_an_unclaimed_or_unknown_dispatch_is_false(agent):
    dispatch = open_dispatch(agent)
    assert not dispatch_finish(dispatch_id=dispatch.pk, worker="w")
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.PENDING
    assert not dispatch_finish(dispatch_id=987654321, worker="w")


def test_an_external_agents_dispatch_pending_again_publishes_no_job(
    django_capture_on_commit_callbacks,
):
    dispatch = open_dispatch(AgentFactory(executor="external"))
    dispatch_claim(dispatch_id=dispatch.pk, worker="w")
    with django_capture_on_commit_callbacks() as callbacks:
        assert dispatch_finish(dispatch_id=dispatch.pk, worker="w", run_again_after=5)
    assert callbacks == []
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.PENDING
    assert dispatch.enqueues == 1


def test_a_finished_task_closes_its_claimed_dispatch_and_no_other(agent):
    dispatch = open_dispatch(agent)
    other = open_dispatch(agent)
    assert dispatch_claim(dispatch_id=dispatch.pk, worker="w1") is not None
    services.task_cancel(task_id=dispatch.task_id)
    dispatch.refresh_from_db()
    assert (dispatch.state, dispatch.lease_expires_at) == (DispatchState.DONE, None)
    other.refresh_from_db()
    assert other.state == DispatchState.PENDING
