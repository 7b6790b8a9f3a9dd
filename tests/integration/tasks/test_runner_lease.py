"""The runner keeps a run's lease alive (tasks/executors/leases.py, one keeper thread per
process): a run longer than its lease is renewed while it runs, so the sweeper never takes it
over; a quick run costs no thread of its own."""

import contextlib
import math
import threading
import time

import pytest
from django.utils import timezone

from tasks.dispatch import dispatch_claim, dispatch_renew
from tasks.executors import REGISTRY, leases, runner
from tasks.models import DispatchState, ExecutorDispatch
from tests.factories import AgentFactory, task_create, user_message
from tests.processes import wait_until

# Generous: each renewal is due within a second; a loaded machine may delay it, not lose it.
RENEWAL_DEADLINE = 30

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

        def lease():
            dispatch.refresh_from_db()
            return dispatch.lease_expires_at

        # Renewed during the run (every 0.5 s): a renewal moves the lease at least one
        # interval past the claim's. Not renewed, it would never move.
        wait_until(
            lambda: (lease() - first).total_seconds() >= 0.45,
            timeout=RENEWAL_DEADLINE,
            interval=0.05,
            message="the lease renewed during the run",
        )
        # The run goes on past the lease its claim gave: the lease is still the run's then.
        while timezone.now() <= first:
            time.sleep(0.05)
        renewed = lease()
        seen.append((first, renewed, timezone.now(), dispatch.state, dispatch.claimed_by))

    monkeypatch.setitem(REGISTRY, "conformance", slow)
    agent = AgentFactory(executor="conformance")
    for _ in range(2):
        task = task_create(agent=agent, owner="o", message=user_message("hi"))
        dispatch = ExecutorDispatch.objects.get(task=task)
        assert runner.run_dispatch(dispatch_id=dispatch.pk, worker="w1") == "done"

    assert len(seen) == 2
    for first, last, now, state, claimed_by in seen:
        assert (last - first).total_seconds() >= 0.45
        assert last > now, "the lease lapsed under a run that went on"
        assert (state, claimed_by) == (DispatchState.CLAIMED, "w1")


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
        task = task_create(agent=agent, owner="o", message=user_message("hi"))
        dispatch = ExecutorDispatch.objects.get(task=task)
        claims.append(dispatch_claim(dispatch_id=dispatch.pk, worker=worker))
    first, second = claims
    one, two = ("w1", [first.dispatch_id]), ("w2", [second.dispatch_id])
    with fresh_keeper.renewing(first.dispatch_id, "w1"):
        with fresh_keeper.renewing(second.dispatch_id, "w2"):
            wait_until(
                lambda: one in renewals and two in renewals,
                timeout=RENEWAL_DEADLINE,
                message="both leases renewed while both runs go on",
            )
        while_both = list(renewals)
        # The first is renewed twice more: two intervals passed with the second's run over.
        wait_until(
            lambda: renewals[len(while_both) :].count(one) >= 2,
            timeout=RENEWAL_DEADLINE,
            message="the first lease renewed twice after the second run ended",
        )
        while_first = renewals[len(while_both) :]
    # Nothing is renewed once both runs ended: no event to wait for, so a window of two
    # intervals (0.5 s each) in which none may come.
    time.sleep(1.0)
    after = renewals[len(while_both) + len(while_first) :]

    # At most one renewal of the second was already under way when its run ended.
    assert while_first.count(two) <= 1
    assert after in ([], [one])  # the same: one under way at most
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
        task = task_create(agent=agent, owner="o", message=user_message("hi"))
        dispatch = ExecutorDispatch.objects.get(task=task)
        ids.append(dispatch_claim(dispatch_id=dispatch.pk, worker="w1").dispatch_id)
    with contextlib.ExitStack() as stack:
        for dispatch_id in ids:
            stack.enter_context(fresh_keeper.renewing(dispatch_id, "w1"))
        wait_until(lambda: renewals, timeout=RENEWAL_DEADLINE, message="a renewal")

    assert renewals[0] == sorted(ids)


def test_a_lost_lease_is_not_taken_back_and_the_others_are_still_renewed(
    settings, fresh_keeper, monkeypatch
):
    settings.A2A_DISPATCH_LEASE_SECONDS = 1.5
    renewed: list[tuple[list[int], int]] = []  # each renewal done: its ids, how many still ours

    def recorded(*, dispatch_ids, worker):
        kept = dispatch_renew(dispatch_ids=dispatch_ids, worker=worker)
        renewed.append((sorted(dispatch_ids), kept))
        return kept

    monkeypatch.setattr(leases, "dispatch_renew", recorded)
    agent = AgentFactory(executor="conformance")
    claims = []
    for _ in range(2):
        task = task_create(agent=agent, owner="o", message=user_message("hi"))
        dispatch = ExecutorDispatch.objects.get(task=task)
        claims.append(dispatch_claim(dispatch_id=dispatch.pk, worker="w1"))
    lost, kept = claims
    # The sweeper took the first one back meanwhile.
    ExecutorDispatch.objects.filter(pk=lost.dispatch_id).update(
        state=DispatchState.PENDING, claimed_by=""
    )
    with (
        fresh_keeper.renewing(lost.dispatch_id, "w1"),
        fresh_keeper.renewing(kept.dispatch_id, "w1"),
    ):
        # Both due together: renewed (or tried) in one statement, which found one still claimed.
        wait_until(
            lambda: (
                any(lost.dispatch_id in ids for ids, _ in renewed)
                and any(kept.dispatch_id in ids for ids, _ in renewed)
            ),
            timeout=RENEWAL_DEADLINE,
            message="a renewal of both leases done",
        )

    assert renewed[0] == (sorted([lost.dispatch_id, kept.dispatch_id]), 1)
    lost_row = ExecutorDispatch.objects.get(pk=lost.dispatch_id)
    kept_row = ExecutorDispatch.objects.get(pk=kept.dispatch_id)
    assert (lost_row.state, lost_row.claimed_by) == (DispatchState.PENDING, "")
    assert lost_row.lease_expires_at == lost.lease_expires_at
    assert kept_row.lease_expires_at > kept.lease_expires_at


def test_quick_runs_start_no_thread_and_wake_no_keeper(settings, fresh_keeper, monkeypatch):
    agent = AgentFactory(executor="echo")
    for n in range(20):
        task_create(agent=agent, owner="o", message=user_message(f"hi {n}"))
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
    with fresh_keeper.renewing(0, "elsewhere"):
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
