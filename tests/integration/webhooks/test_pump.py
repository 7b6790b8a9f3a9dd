"""The delivery pump in this process (webhooks/pump.py) against a real receiver process, and
its wake-ups through the real Redis broker (webhooks/wake.py).

Worker processes running pumps are tested in test_delivery_e2e.py and tests/fault/webhooks.
"""

from __future__ import annotations

import collections

import pytest
import redis
from django.conf import settings as django_settings

from tasks import services
from tasks.states import TaskState
from tests.factories import AgentFactory, user_message
from tests.webhook_checks import configure
from webhooks import wake
from webhooks.models import Delivery, DeliveryState
from webhooks.pump import run_pump
from webhooks.services import push_config_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _loopback(settings):
    configure(settings)


@pytest.fixture
def broker():
    """The test broker's Redis, with the wake flag and the `webhooks` queue emptied."""
    url = django_settings.CELERY_BROKER_URL
    if not url.startswith("redis://"):
        pytest.skip("wake-ups coalesce through a Redis broker only")
    client = redis.Redis.from_url(url)
    client.delete(wake.FLAG_KEY, "webhooks")
    yield client
    client.delete(wake.FLAG_KEY, "webhooks")


def queued(client) -> int:
    return client.llen("webhooks")


def test_wake_publishes_once_until_a_pump_claims(broker):
    assert wake.wake() is True
    assert queued(broker) == 1
    assert wake.wake() is True  # the flag is set: the queued pump will claim this too
    assert queued(broker) == 1
    assert broker.pttl(wake.FLAG_KEY) > 0  # a lost job's flag expires

    wake.hold()  # a pump claims ...
    assert wake.wake() is True
    assert queued(broker) == 1
    wake.release()  # ... and stops claiming: the next write needs a job again
    assert wake.wake() is True
    assert queued(broker) == 2

    assert wake.wake(force=True) is True  # the sweeper's and a starting worker's
    assert queued(broker) == 3


def test_every_event_write_wakes_once_per_burst(broker):
    agent = AgentFactory(executor="external")
    task = services.task_create(agent=agent, owner="o", message=user_message("hi"))
    push_config_create(task=task, config={"id": "a", "url": "http://127.0.0.1:9/hook"})
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    assert Delivery.objects.filter(config__task=task).count() == 3
    assert queued(broker) == 1  # three commits, one pump to claim them


def test_one_pump_delivers_every_backlog_in_order(receivers, broker):
    receiver = receivers.start()
    agent = AgentFactory(executor="external")
    tasks = []
    for _ in range(6):
        task = services.task_create(agent=agent, owner="o", message=user_message("hi"))
        push_config_create(task=task, config={"id": "a", "url": receiver.url})
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        for i in range(3):
            services.task_add_artifact(
                task_id=task.pk,
                artifact={"artifactId": f"art-{i}", "parts": [{"text": str(i)}]},
            )
        services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
        tasks.append(task)
    owed = Delivery.objects.filter(config__task__in=tasks)
    total = owed.count()
    assert total == 6 * 6  # snapshot, working, three artifacts, completed

    run = run_pump()

    assert (run.claimed, run.recorded, run.delivered) == (total, total, total)
    assert set(owed.values_list("state", flat=True)) == {DeliveryState.DELIVERED}
    records = receiver.wait_for(lambda rs: len(rs) >= total, message="every delivery")
    assert len(records) == total
    seqs = collections.defaultdict(list)
    for record in records:
        seqs[record.header("x-a2a-task-id")].append(record.seq)
    assert sorted(seqs) == sorted(str(task.pk) for task in tasks)
    for received in seqs.values():
        assert received == sorted(received)  # per config, strictly in order
    assert not broker.exists(wake.FLAG_KEY)  # released: the next write wakes a new pump
