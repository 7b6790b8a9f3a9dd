"""A starting worker rings for a delivery pump for what is due (webhooks/signals.py).

Isolated: no beat (so no sweeper job and no heartbeat), an external executor (so no executor
job writes events once the worker runs), and the jobs the writes' rings published are dropped
from the broker, as when the worker that had them died or Redis restarted. What the
database owes can then only be delivered because the worker, as it starts, looks for it.
"""

from __future__ import annotations

import pytest
import redis
from django.conf import settings as django_settings

from agents.models import WorkerHeartbeat
from tasks import services
from tasks.states import TaskState
from tests.webhook_checks import assert_delivered, open_task, start_worker, wait_all
from webhooks.delivery import bell
from webhooks.selectors import due_configs

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]


def drop_rings() -> None:
    """Lose every published delivery job and the pumps' bell (naming a job nobody runs), so
    nothing already in the broker can start a pump."""
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
    # The writes rang: the first published a job and named the bell after it, which the
    # later rings found named (one job per burst).
    assert broker.llen("webhooks") == 1, "the writes rang: one job was published"
    keys = [*broker.scan_iter("webhooks*"), *broker.scan_iter(f"{bell.BELL_KEY}*")]
    if keys:
        broker.delete(*keys)
    assert not list(broker.scan_iter("webhooks*"))
    assert broker.get(bell.BELL_KEY) is None


def test_a_starting_worker_delivers_what_came_due_while_no_worker_ran(agent, procs, receivers):
    receiver = receivers.start()
    configs = []
    for text in ("first", "second"):
        task, pushes = open_task(agent, text, {"url": receiver.url})
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        services.task_add_artifact(
            task_id=task.pk, artifact={"artifactId": "a", "parts": [{"text": text}]}
        )
        services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
        configs.extend(pushes)
    drop_rings()
    assert sorted(due_configs()) == sorted(c.pk for c in configs)
    assert receiver.records() == []

    worker = start_worker(procs)
    for config in configs:
        wait_all(config, timeout=20)

    for config in configs:
        records = assert_delivered(receiver, config, agent)
        assert [r.header("x-a2a-event-kind") for r in records] == [
            "snapshot", "status", "artifact", "status",
        ]  # fmt: skip
    assert due_configs() == []
    # It counts as a delivery worker for the readiness gate once that re-enqueue was done.
    (registered,) = WorkerHeartbeat.objects.all()
    assert registered.hostname.startswith("worker@")
    assert registered.backlog_reenqueued_at is not None
    assert "Unrecoverable error" not in worker.log()
