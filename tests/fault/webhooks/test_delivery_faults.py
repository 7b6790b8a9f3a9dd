"""Webhook delivery under faults, with real processes: a receiver that goes away or misbehaves,
a worker SIGKILLed mid-POST, a Redis restart.

In every case: zero events lost (the config's snapshot and every status/artifact event after
it reach the receiver, verified), duplicates only with the same webhook-id, and per-config
order preserved (tests.webhook_checks.assert_delivered). The worker runs the threads pool with
short timings: retries every ~1 s (20 of them, so an outage of a few seconds never
dead-letters), a 2 s timeout; beat, where it runs, sweeps every second.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time

import pytest
import redis

from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.factories import user_message
from tests.live import free_port
from tests.processes import wait_until
from tests.webhook_checks import (
    accepted,
    assert_delivered,
    deliveries,
    open_task,
    start_beat,
    start_worker,
    wait_all,
)
from webhooks.models import DeliveryAttempt, DeliveryState, Endpoint

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]

TOKEN = "fault-token"
FAULT_ENV = {
    "A2A_WEBHOOK_RETRY_SCHEDULE": ",".join(["1"] * 20),
    # Executor dispatch recovers fast too (the Redis restart loses its broker message).
    "A2A_SWEEP_INTERVAL_SECONDS": "1",
    "A2A_DISPATCH_UNCLAIMED_SECONDS": "2",
    "A2A_DISPATCH_LEASE_SECONDS": "3",
}


def worker(procs, name: str = "worker", **env: str):
    return start_worker(procs, name=name, **{**FAULT_ENV, **env})


def beat(procs):
    return start_beat(procs, **FAULT_ENV)


def attempts_of(delivery) -> list[tuple[int | None, str]]:
    return list(
        DeliveryAttempt.objects.filter(delivery=delivery).values_list("status", "error_class")
    )


def state_of(task: Task) -> TaskState:
    return Task.objects.get(pk=task.pk).task_state


def test_receiver_down_for_a_while_then_back_everything_arrives_in_order(
    scripted_agent, procs, receivers
):
    """Delivered up to input-required; the receiver process stops; the client continues the
    task, whose remaining events are all produced while nobody listens; the receiver comes
    back on the same port and gets every one, in order, once."""
    receiver = receivers.start()
    worker(procs)
    task, (config,) = open_task(
        scripted_agent, "ask; chunks 3", {"url": receiver.url, "token": TOKEN}
    )
    wait_until(
        lambda: (
            state_of(task) == TaskState.INPUT_REQUIRED
            and {d.state for d in deliveries(config)} == {DeliveryState.DELIVERED}
        ),
        timeout=20,
        message="delivered up to input-required",
    )
    delivered_before = len(deliveries(config))
    assert delivered_before == 3  # snapshot, working, input-required
    assert len(receiver.records()) == 3

    receiver.stop()
    services.task_send(
        agent=scripted_agent,
        owner="o",
        message=user_message("more", taskId=str(task.pk)),
    )
    wait_until(lambda: state_of(task) == TaskState.COMPLETED, timeout=20, message="completed")
    wait_until(
        lambda: (
            DeliveryAttempt.objects.filter(delivery__config=config, error_class="connect").count()
            >= 3
        ),
        timeout=20,
        message="three refused tries",
    )
    assert len(receiver.records()) == 3  # nothing got through while it was down
    receiver.start()

    wait_all(config, timeout=30)
    records = assert_delivered(receiver, config, scripted_agent, token=TOKEN)
    # working, three chunks, the echo artifact, completed: produced while it was down.
    assert len(records) == delivered_before + 6
    head = deliveries(config)[delivered_before]
    tries = attempts_of(head)
    assert len(tries) >= 4
    assert tries[:-1] == [(None, "connect")] * (len(tries) - 1)
    assert tries[-1] == (200, "")
    later = deliveries(config)[delivered_before + 1 :]
    assert all(attempts_of(d) == [(200, "")] for d in later)  # in order: none tried early


def test_500_then_429_with_retry_after_then_hang_then_200_is_retried_then_delivered(
    scripted_agent, procs, receivers
):
    script = [{"status": 500}, {"status": 429, "retry_after": 2}, {"hang": 30}, {"status": 200}]
    receiver = receivers.start(sequence=script)
    worker(procs)
    task, (config,) = open_task(scripted_agent, "chunks 3", {"url": receiver.url})
    wait_all(config, timeout=30)

    records = assert_delivered(receiver, config, scripted_agent, exactly_once=False)
    head, *rest = deliveries(config)
    tries = [r for r in records if r.webhook_id == str(head.event_id)]
    assert [r.answer for r in tries] == script  # one webhook-id, four tries
    assert attempts_of(head) == [(500, ""), (429, ""), (None, "timeout"), (200, "")]
    assert (head.attempts, head.last_status) == (4, 200)
    # Retry-After: 2 outweighs the 1 s schedule; the hung try is abandoned at the 2 s timeout.
    assert tries[2].at - tries[1].at >= 1.9
    assert tries[3].at - tries[2].at >= 2.0
    # Nothing else of the config went out before the head was accepted, then once each.
    assert all(r.at > tries[3].at for r in records if r.webhook_id != str(head.event_id))
    assert all(attempts_of(d) == [(200, "")] for d in rest)
    endpoint = Endpoint.objects.get(origin=receiver.origin)
    assert endpoint.consecutive_failures == 0
    assert endpoint.last_success_at > endpoint.last_failure_at


def test_worker_killed_mid_post_the_delivery_is_sent_again_after_its_lease(
    scripted_agent, procs, receivers
):
    """The receiver hangs while the worker posts the snapshot; the worker is SIGKILLed
    mid-POST (its attempt never recorded). A new worker and beat: once the lease (timeout 4 s
    + margin 1 s) has passed, the sweeper hands the delivery on; it is sent again with the
    same webhook-id, and everything after it follows in order."""
    env = {"A2A_WEBHOOK_TIMEOUT_SECONDS": "4", "A2A_WEBHOOK_LEASE_MARGIN_SECONDS": "1"}
    receiver = receivers.start(hang=30)
    first = worker(procs, name="first", **env)
    task, (config,) = open_task(scripted_agent, "chunks 3", {"url": receiver.url})
    receiver.wait_for(lambda rs: len(rs) >= 1, timeout=15, message="the first POST")
    first.kill(signal.SIGKILL)

    head = deliveries(config)[0]
    assert head.state == DeliveryState.SENDING
    assert head.attempts == 1
    attempt = DeliveryAttempt.objects.get(delivery=head)
    # Killed mid-POST: the try was claimed (a lease) but its outcome never recorded.
    assert (attempt.status, attempt.duration_ms, attempt.error_class) == (None, None, "")

    receiver.behave(status=200)
    beat(procs)
    worker(procs, name="second", **env)
    wait_all(config, timeout=40)

    records = assert_delivered(receiver, config, scripted_agent, exactly_once=False)
    tries = [r for r in records if r.webhook_id == str(head.event_id)]
    assert [accepted(r) for r in tries] == [False, True]
    assert len(records) == len(deliveries(config)) + 1  # the one duplicate, same webhook-id
    # Not before the lease passed: the sweeper, not a redelivered message, resent it.
    assert tries[1].at - tries[0].at >= 5 - 0.5
    head.refresh_from_db()
    assert head.attempts == 2
    assert attempts_of(head) == [(None, ""), (200, "")]


class RedisServer:
    """A Redis server of the test's own on a free port, stopped and started at will."""

    def __init__(self, workdir) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.popen: subprocess.Popen | None = None

    def up(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def start(self) -> None:
        self.popen = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self.up, timeout=15, message="Redis up")

    def stop(self) -> None:
        if self.popen is not None:
            self.popen.terminate()
            self.popen.wait(timeout=10)
        wait_until(lambda: not self.up(), timeout=10, message="Redis down")

    @contextlib.contextmanager
    def outage(self):
        """Down (every queued message lost with it), then up again, even if the test fails."""
        self.stop()
        try:
            yield
        finally:
            self.start()


def _point_broker_at(url: str) -> None:
    """This process publishes jobs and rings to `url` from now on (Celery's producer pools
    are dropped, as after a fork; the bell's client is the one for the URL in settings)."""
    from a2a_platform.celery import app

    app.conf.broker_write_url = url
    app._pool = None
    app.amqp._producer_pool = None
    publishes_to = app.amqp.producer_pool.connections.connection.as_uri()
    assert publishes_to.endswith(url.split("://", 1)[1]), publishes_to


@pytest.fixture
def private_broker(settings, tmp_path):
    """The test process, its worker and its beat on a Redis server of their own, so an outage
    takes down nothing else on the machine (other test runs, benchmarks)."""
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is not installed (the README's setup installs it)")
    server = RedisServer(tmp_path)
    server.start()
    previous = settings.CELERY_BROKER_URL
    settings.CELERY_BROKER_URL = server.url  # what the worker and beat are started with
    _point_broker_at(server.url)
    try:
        yield server
    finally:
        _point_broker_at(previous)
        server.stop()


def test_redis_restarted_mid_run_everything_is_delivered(
    private_broker, scripted_agent, procs, receivers
):
    """Redis goes away while a head delivery is being retried (its retry messages and every
    queued job are lost with it) and while a new task with a webhook is accepted (its
    executor and delivery jobs cannot be published). Once Redis is back, worker and beat
    reconnect, the sweepers re-enqueue from the database, and everything is delivered."""
    receiver = receivers.start(status=500)
    celery_beat = beat(procs)
    celery_worker = worker(procs)
    before, (first_config,) = open_task(scripted_agent, "chunks 3", {"url": receiver.url})
    wait_until(
        lambda: (
            state_of(before) == TaskState.COMPLETED and deliveries(first_config)[0].attempts >= 2
        ),
        timeout=20,
        message="the first task done, its head being retried",
    )

    with private_broker.outage():
        receiver.behave(status=200)
        during, (second_config,) = open_task(scripted_agent, "chunks 3", {"url": receiver.url})
        time.sleep(2)
        # Nothing could be dispatched: the task waits, durably, with its snapshot owed.
        assert state_of(during) == TaskState.SUBMITTED
        # Owed durably. A pump already running when Redis went may still deliver it: the
        # claims and records need only PostgreSQL (a full run saw it delivered here).
        assert deliveries(second_config)[0].state in (
            DeliveryState.PENDING,
            DeliveryState.DELIVERED,
        )

    wait_all(first_config, timeout=60)
    wait_all(second_config, timeout=60)
    assert_delivered(receiver, first_config, scripted_agent, exactly_once=False)
    assert_delivered(receiver, second_config, scripted_agent)
    assert state_of(during) == TaskState.COMPLETED
    assert celery_worker.popen.poll() is None, "the worker survived the outage"
    assert "Unrecoverable error" not in celery_worker.log()
    assert celery_beat.popen.poll() is None, "beat survived the outage"
