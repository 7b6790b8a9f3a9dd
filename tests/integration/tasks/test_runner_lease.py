"""The runner keeps a run's lease alive (tasks/executors/runner.py `_LeaseKeeper`): a run
longer than its lease is renewed while it runs, so the sweeper never takes it over."""

import time

import pytest

from tasks import services
from tasks.executors import REGISTRY, runner
from tasks.models import ExecutorDispatch
from tests.factories import AgentFactory, user_message

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_longer_than_its_lease_keeps_it(settings, monkeypatch):
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
