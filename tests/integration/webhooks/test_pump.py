"""The delivery pump in this process (webhooks/delivery/pump.py) against a real receiver process,
and its bell through the real Redis broker (webhooks/delivery/bell.py).

Worker processes running pumps are tested in test_delivery_e2e.py and tests/fault/webhooks.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection, transaction

from tasks import services
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message
from tests.processes import wait_until
from tests.webhook_checks import configure
from webhooks.delivery import bell, pump
from webhooks.delivery.claim_record import (
    delivery_claim_batch,
    delivery_record_many,
    relaxed_commits,
)
from webhooks.delivery.pump import run_pump
from webhooks.delivery.transport import TransportResult
from webhooks.models import Delivery, DeliveryState
from webhooks.services import push_config_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _loopback(settings):
    configure(settings)


@pytest.fixture
def broker():
    """The test broker's Redis, with the pumps' bell and the `webhooks` queue emptied."""
    url = django_settings.CELERY_BROKER_URL
    # `make test` runs against Redis (it stops with a hint when Redis is unreachable).
    assert url.startswith("redis://"), f"the tests need a Redis broker, not {url}"
    client = redis.Redis.from_url(url)

    def clean() -> None:
        client.delete(bell.BELL_KEY, "webhooks", *client.keys(f"{bell.BELL_KEY}:*"))

    clean()
    yield client
    clean()


def ok() -> TransportResult:
    return TransportResult(
        status=200, headers={}, body_excerpt="", duration_ms=1.0, error_class=None, retry_after=None
    )


def queued(client) -> int:
    return client.llen("webhooks")


def task_pushing_to(url: str, agent=None):
    """A task with one push config to `url` (its snapshot delivery owed)."""
    agent = agent or AgentFactory(executor="external")
    task = task_create(agent=agent, owner="o", message=user_message("hi"))
    push_config_create(task=task, config={"id": "a", "url": url})
    return task


@contextlib.contextmanager
def pump_in_a_thread(broker):
    """`run_pump()` on a thread of its own, as a worker would run it (the test runs the pump
    itself: no job, no bell left from the set-up). Yields the list its PumpRun lands in; the
    thread is joined at the end."""
    broker.delete("webhooks", bell.BELL_KEY)
    runs: list[pump.PumpRun] = []

    def pumping() -> None:
        try:
            runs.append(run_pump())
        finally:
            connection.close()

    thread = threading.Thread(target=pumping)
    thread.start()
    try:
        yield runs
    finally:
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_ring_publishes_once_until_a_pump_claims(broker):
    assert bell.ring() is True
    assert queued(broker) == 1
    assert bell.ring() is True  # the bell names the job: the queued pump will claim this too
    assert queued(broker) == 1
    assert broker.pttl(bell.BELL_KEY) > 0  # a lost job's bell expires

    bell.watch()  # a pump claims ...
    assert bell.ring() is True
    assert queued(broker) == 1
    bell.release()  # ... and stops claiming: the next write needs a job again
    assert bell.ring() is True
    assert queued(broker) == 2

    assert bell.ring(force=True) is True  # a starting worker's
    assert queued(broker) == 3


def test_a_ring_reaches_the_pump_watching_the_bell_only(broker):
    """Two pumps listen (as in two workers); a write's ring reaches the one watching the bell,
    so the other does not claim for it. A pump releases the bell only when it names it."""
    pumps = {"a": pump._Signals(), "b": pump._Signals()}
    for signals in pumps.values():
        assert bell.listen(signals.hear)
    try:
        bell.watch(pumps["a"].token)
        # The process's subscriber comes up in the background: ring until the watching pump hears
        # one (the bell watched, each ring publishes no job).
        wait_until(
            lambda: bell.ring() is True and pumps["a"].rung.wait(0.2),
            timeout=10,
            message="a ring heard by the pump watching the bell",
        )
        assert queued(broker) == 0  # the watching pump claims it: no job
        time.sleep(0.2)  # a ring for b would have arrived by now
        assert not pumps["b"].rung.is_set()
        bell.watch(pumps["b"].token)  # b takes the bell over
        bell.release(pumps["a"].token)  # a stops: the bell still names b
        assert broker.get(bell.BELL_KEY) == pumps["b"].token.encode()
        pumps["a"].rung.clear()
        assert bell.ring() is True
        assert pumps["b"].rung.wait(5)
        time.sleep(0.2)  # a ring for a would have arrived by now
        assert not pumps["a"].rung.is_set()
        assert queued(broker) == 0
    finally:
        for signals in pumps.values():
            bell.unlisten(signals.hear)


def test_without_redis_every_ring_publishes(broker, settings):
    """`make run`'s file-system broker has no bell to share: nothing is coalesced, nothing is
    skipped. (The Celery app keeps publishing to the test broker, which lets us count.)"""
    settings.CELERY_BROKER_URL = "filesystem://"
    for _ in range(3):
        assert bell.ring() is True
    bell.watch()
    bell.release()
    assert queued(broker) == 3
    assert not broker.exists(bell.BELL_KEY)


def test_a_transaction_rings_once_however_many_events_it_writes(broker, settings):
    settings.CELERY_BROKER_URL = "filesystem://"  # every ring publishes a job: count them
    agent = AgentFactory(executor="external")
    task = task_create(agent=agent, owner="o", message=user_message("hi"))
    push_config_create(task=task, config={"id": "a", "url": "http://127.0.0.1:9/h"})
    broker.delete("webhooks")

    def artifact(name: str) -> None:
        services.task_add_artifact(
            task_id=task.pk, artifact={"artifactId": name, "parts": [{"text": "x"}]}
        )

    with transaction.atomic():
        for i in range(3):
            artifact(f"a{i}")
    assert queued(broker) == 1
    assert Delivery.objects.filter(task=task, kind="artifact").count() == 3

    # A savepoint that rolls back takes its ring along; an event after it rings again.
    with transaction.atomic():
        with contextlib.suppress(RuntimeError), transaction.atomic():
            artifact("gone")
            raise RuntimeError("roll the savepoint back")
        artifact("kept")
    assert queued(broker) == 2


def test_timed_rings_coalesce_per_quarter_second(broker):
    """Retry and cap hints publish delayed jobs: one per quarter second of due time, not one
    per hint."""
    for _ in range(5):
        assert bell.ring(countdown=30) is True
    assert 1 <= queued(broker) <= 2  # the five fell in one or two quarter-second buckets
    assert bell.ring(countdown=60) is True  # another due time: another job
    assert 2 <= queued(broker) <= 3


def test_every_event_write_rings_once_per_burst(broker):
    agent = AgentFactory(executor="external")
    task = task_create(agent=agent, owner="o", message=user_message("hi"))
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
        task = task_create(agent=agent, owner="o", message=user_message("hi"))
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
    assert not broker.exists(bell.BELL_KEY)  # released: the next write rings for a new pump


def test_a_lingering_pump_hears_new_writes_without_a_job(receivers, broker, settings, monkeypatch):
    """A pump out of work watches the bell for A2A_WEBHOOK_PUMP_LINGER_SECONDS: a write's ring
    then publishes no job, the pump hears it and claims at once. Its own poll is an hour apart
    here, so only the ring can have brought the write in while the pump still watched."""
    settings.A2A_WEBHOOK_PUMP_SECONDS = 4  # the pump ends here, lingering or not
    settings.A2A_WEBHOOK_PUMP_LINGER_SECONDS = 60
    monkeypatch.setattr(pump, "POLL_SECONDS", 3600)
    receiver = receivers.start()
    task = task_pushing_to(receiver.url)
    with pump_in_a_thread(broker) as runs:
        receiver.wait_for(lambda rs: len(rs) >= 1, message="the snapshot")
        wait_until(lambda: not Delivery.objects.exclude(state=DeliveryState.DELIVERED).exists())
        time.sleep(0.5)  # recorded, claimed again, found nothing: lingering
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        records = receiver.wait_for(lambda rs: len(rs) >= 2, message="the working update")
        assert broker.exists(bell.BELL_KEY)  # received while the pump still watched the bell
        assert queued(broker) == 0  # the write published no job
    assert [r.seq for r in records] == [1, 2]
    assert (runs[0].claimed, runs[0].delivered) == (2, 2)


def test_at_a_low_rate_a_pump_claims_once_per_event(receivers, broker, settings, monkeypatch):
    """Events one at a time, each recorded before the next is written: the pump claims once
    for each (on its ring), not again after each record, where nothing is left to find."""
    settings.A2A_WEBHOOK_PUMP_SECONDS = 4
    settings.A2A_WEBHOOK_PUMP_LINGER_SECONDS = 60
    monkeypatch.setattr(pump, "POLL_SECONDS", 3600)  # no claim comes from polling
    receiver = receivers.start()
    task = task_pushing_to(receiver.url)

    def all_delivered() -> bool:
        return not Delivery.objects.exclude(state=DeliveryState.DELIVERED).exists()

    with pump_in_a_thread(broker) as runs:
        wait_until(all_delivered, message="the snapshot")
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        wait_until(all_delivered, message="the working update")
        for i in range(3):
            services.task_add_artifact(
                task_id=task.pk, artifact={"artifactId": f"a{i}", "parts": [{"text": "x"}]}
            )
            wait_until(all_delivered, message=f"artifact {i}")
        with transaction.atomic():  # three at once: one ring; each record leaves the next due
            for i in range(3, 6):
                services.task_add_artifact(
                    task_id=task.pk, artifact={"artifactId": f"a{i}", "parts": [{"text": "x"}]}
                )
        wait_until(all_delivered, timeout=3, message="the three, without a poll")
    assert (runs[0].claimed, runs[0].delivered) == (8, 8)
    # One claim per delivery (the transaction's three ring once) and the last one, which
    # found nothing before the pump stopped. (Claiming after every record as well made 16.)
    assert runs[0].claims == 8 + 1


def test_past_its_deadline_a_pump_claims_on_until_its_successor_watches_the_bell(
    receivers, broker, settings
):
    """A busy pump at its deadline publishes its successor's job and keeps claiming, so a
    write then does not wait for the successor to start; once the successor watches the bell it
    stops claiming, drains and leaves the successor's bell alone."""
    settings.A2A_WEBHOOK_PUMP_SECONDS = 0.5
    settings.A2A_WEBHOOK_PUMP_LINGER_SECONDS = 60
    slow = receivers.start("slow", hang=1.5)  # a send in flight across the deadline
    fast = receivers.start("fast")
    task_pushing_to(slow.url)
    task = task_pushing_to(fast.url)

    def artifact(name: str) -> Delivery:
        services.task_add_artifact(
            task_id=task.pk, artifact={"artifactId": name, "parts": [{"text": "x"}]}
        )
        return Delivery.objects.filter(task=task).latest("id")

    with pump_in_a_thread(broker) as runs:
        wait_until(lambda: queued(broker) == 1, timeout=3, message="the successor's job")
        after_deadline = artifact("after-deadline")
        wait_until(
            lambda: Delivery.objects.get(pk=after_deadline.pk).state == DeliveryState.DELIVERED,
            timeout=3,
            message="claimed past the deadline",
        )
        bell.watch("successor")  # the successor starts claiming
        left_over = artifact("for-the-successor")
    assert runs[0].claimed == 3  # both snapshots and the write after the deadline
    assert Delivery.objects.get(pk=left_over.pk).state == DeliveryState.PENDING
    assert broker.get(bell.BELL_KEY) == b"successor"


def test_concurrent_claimers_never_share_a_config_nor_break_its_order():
    """Eight threads claim and record at once over 10 configs x 5 deliveries: every delivery is
    claimed exactly once, and each config's deliveries are claimed in order."""
    agent = AgentFactory(executor="external")
    configs = []
    for _ in range(10):
        task = task_create(agent=agent, owner="o", message=user_message("hi"))
        binding = push_config_create(task=task, config={"id": "a", "url": "http://127.0.0.1:9/h"})
        for i in range(4):
            services.task_add_artifact(
                task_id=task.pk, artifact={"artifactId": f"a{i}", "parts": [{"text": "x"}]}
            )
        configs.append(binding.config)
    total = Delivery.objects.filter(config__in=configs).count()
    assert total == 50
    claimed: list[tuple[int, int, float]] = []  # (config, delivery, when)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer() -> None:
        try:
            idle_since = time.monotonic()
            while time.monotonic() - idle_since < 1.0:
                claims = delivery_claim_batch(limit=3).claims
                if not claims:
                    time.sleep(0.005)
                    continue
                idle_since = time.monotonic()
                with lock:
                    claimed.extend((c.config_pk, c.delivery_pk, time.monotonic()) for c in claims)
                delivery_record_many([(c, ok()) for c in claims])
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert sorted(d for _, d, _ in claimed) == sorted(
        Delivery.objects.filter(config__in=configs).values_list("pk", flat=True)
    )  # each exactly once
    for config in configs:
        order = [d for c, d, _ in sorted(claimed, key=lambda x: x[2]) if c == config.pk]
        assert order == sorted(order)
    assert set(Delivery.objects.filter(config__in=configs).values_list("attempts", flat=True)) == {
        1
    }


def test_relaxed_commits_end_with_the_pump():
    """Claims and records skip the WAL flush; the pooled connection goes back durable."""

    def synchronous_commit() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            return cursor.fetchone()[0]

    before = synchronous_commit()
    with relaxed_commits():
        assert synchronous_commit() == "off"
    assert synchronous_commit() == before == "on"
    run_pump()  # nothing due: claims nothing, and restores the setting too
    assert synchronous_commit() == "on"
