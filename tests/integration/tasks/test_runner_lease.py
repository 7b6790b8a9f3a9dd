"""The runner keeps a run's lease alive (tasks/executors/leases.py, one keeper thread per
process): a run longer than its lease is renewed while it runs, so the sweeper never takes it
over; a quick run costs no thread of its own."""

import contextlib
import math
import threading
import time

import pytest

from tasks import services
from tasks.dispatch import dispatch_claim, dispatch_renew
from tasks.executors import REGISTRY, leases, runner
from tasks.models import DispatchState, ExecutorDispatch
from tests.factories import AgentFactory, user_message

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fresh_keeper(monkeypatch):
    """A keeper of this test's own (the process's may hold another test's timing)."""
    own = leases.LeaseKeeper()
    monkeypatch.setattr(leases, "keeper", lambda: own)
    return own


def test_a_run_longer_than_its_lease_keeps_it(settings, monkeypatch, fresh_keeper):
    settings.A2A_DISPATCH_LEASE_SECONDS = 1.5  # renewed every 0.5 s
    seen: list[tuple] = []

    def slow(ctx):
        dispatch = ExecutorDispatch.objects.get(task_id=ctx.task_id)
        first = dispatch.lease_expires_at
        time.sleep(1.6)
        dispatch.refresh_from_db()
        seen.append((first, dispatch.lease_expires_at, dispatch.claimed_by))

    monkeypatch.setitem(REGISTRY, "conformance", slow)
    agent = AgentFactory(executor="conformance")
    for _ in range(2):
        task = services.task_create(agent=agent, owner="o", message=user_message("hi"))
        dispatch = ExecutorDispatch.objects.get(task=task)
        assert runner.run_dispatch(dispatch_id=dispatch.pk, worker="w1") == "done"

    for first, last, claimed_by in seen:
        # Renewed during the run (every 0.5 s): each renewal moves the lease at least one
        # interval past the claim's. Not renewed, it would not have moved at all.
        assert (last - first).total_seconds() >= 0.45
        assert claimed_by == "w1"
    assert len(seen) == 2


def test_each_lease_is_renewed_while_its_run_goes_on_and_no_longer(
    settings, fresh_keeper, monkeypatch
):
    settings.A2A_DISPATCH_LEASE_SECONDS = 1.5  # renewed every 0.5 s
    renewals: list[tuple[str, list[int]]] = []

    def recorded(*, dispatch_ids, worker):
        renewals.append((worker, sorted(dispatch_ids)))
        return dispatch_renew(dispatch_ids=dispatch_ids, worker=worker)

    monkeypatch.setattr(leases, "dispatch_renew", recorded)
    agent = AgentFactory(executor="conformance")
    claims = []
    for worker in ("w1", "w2"):
        task = services.task_create(agent=agent, owner="o", message=user_message("hi"))
        dispatch = ExecutorDispatch.objects.get(task=task)
        claims.append(dispatch_claim(dispatch_id=dispatch.pk, worker=worker))
    first, second = claims
    with fresh_keeper.held(first.dispatch_id, "w1"):
        with fresh_keeper.held(second.dispatch_id, "w2"):
            time.sleep(1.2)
        while_both = list(renewals)
        time.sleep(1.2)
        while_first = renewals[len(while_both) :]
    time.sleep(1.0)
    after = renewals[len(while_both) + len(while_first) :]

    assert ("w1", [first.dispatch_id]) in while_both
    assert ("w2", [second.dispatch_id]) in while_both
    # At most one renewal of the second was already under way when its run ended.
    assert while_first.count(("w1", [first.dispatch_id])) >= 1
    assert while_first.count(("w2", [second.dispatch_id])) <= 1
    assert after in ([], [("w1", [first.dispatch_id])])  # the same: one under way at most
    leases_now = dict(
        ExecutorDispatch.objects.filter(pk__in=[first.dispatch_id, second.dispatch_id]).values_list(
            "pk", "lease_expires_at"
        )
    )
    assert leases_now[first.dispatch_id] > first.lease_expires_at
    assert leases_now[second.dispatch_id] > second.lease_expires_at


def test_leases_due_together_are_renewed_in_one_statement(settings, fresh_keeper, monkeypatch):
    settings.A2A_DISPATCH_LEASE_SECONDS = 1.5
    renewals: list[list[int]] = []

    def recorded(*, dispatch_ids, worker):
        renewals.append(sorted(dispatch_ids))
        return dispatch_renew(dispatch_ids=dispatch_ids, worker=worker)

    monkeypatch.setattr(leases, "dispatch_renew", recorded)
    agent = AgentFactory(executor="conformance")
    ids = []
    for _ in range(3):
        task = services.task_create(agent=agent, owner="o", message=user_message("hi"))
        dispatch = ExecutorDispatch.objects.get(task=task)
        ids.append(dispatch_claim(dispatch_id=dispatch.pk, worker="w1").dispatch_id)
    with contextlib.ExitStack() as stack:
        for dispatch_id in ids:
            stack.enter_context(fresh_keeper.held(dispatch_id, "w1"))
        time.sleep(0.8)

    assert renewals[0] == sorted(ids)


def test_a_lost_lease_is_not_taken_back_and_the_others_are_still_renewed(settings, fresh_keeper):
    settings.A2A_DISPATCH_LEASE_SECONDS = 1.5
    agent = AgentFactory(executor="conformance")
    claims = []
    for _ in range(2):
        task = services.task_create(agent=agent, owner="o", message=user_message("hi"))
        dispatch = ExecutorDispatch.objects.get(task=task)
        claims.append(dispatch_claim(dispatch_id=dispatch.pk, worker="w1"))
    lost, kept = claims
    # The sweeper took the first one back meanwhile.
    ExecutorDispatch.objects.filter(pk=lost.dispatch_id).update(
        state=DispatchState.PENDING, claimed_by=""
    )
    with fresh_keeper.held(lost.dispatch_id, "w1"), fresh_keeper.held(kept.dispatch_id, "w1"):
        time.sleep(0.8)

    lost_row = ExecutorDispatch.objects.get(pk=lost.dispatch_id)
    kept_row = ExecutorDispatch.objects.get(pk=kept.dispatch_id)
    assert (lost_row.state, lost_row.claimed_by) == (DispatchState.PENDING, "")
    assert lost_row.lease_expires_at == lost.lease_expires_at
    assert kept_row.lease_expires_at > kept.lease_expires_at


def test_quick_runs_start_no_thread_and_wake_no_keeper(settings, fresh_keeper, monkeypatch):
    agent = AgentFactory(executor="echo")
    for n in range(20):
        services.task_create(agent=agent, owner="o", message=user_message(f"hi {n}"))
    started: list[str] = []
    real_start = threading.Thread.start

    def counted(self):
        started.append(self.name)
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    woken: list[float] = []
    real_notify = fresh_keeper._changed.notify

    def notify(n=1):
        woken.append(time.monotonic())
        real_notify(n)

    # A long run elsewhere in this process: the keeper waits for its lease's renewal.
    with fresh_keeper.held(0, "elsewhere"):
        deadline = time.monotonic() + 5
        while fresh_keeper._until == math.inf and time.monotonic() < deadline:
            time.sleep(0.01)
        monkeypatch.setattr(fresh_keeper._changed, "notify", notify)

        assert runner.run_due(worker="w1") == 20

    # The keeper's own thread, once; none per run. And none of the runs woke it: each lease
    # is due later than the one it waits for.
    assert started == ["lease-keeper"]
    assert woken == []
    assert ExecutorDispatch.objects.filter(state=DispatchState.DONE).count() == 20
