"""The webhook outbox on PostgreSQL: rows written with the events, then claimed and recorded.

Services only (no protocol app, no worker, no HTTP): `delivery_claim_head` / `delivery_record`
get a TransportResult built by hand, which is all the delivery policy ever sees of a send.
Time is moved with time_machine; DNS answers a public address for the test host names.

Every test runs twice, the store picked by `settings.A2A_STORE`: through the PostgreSQL
statements production runs and through the ORM statements of the embedded database
(webhooks/delivery/outbox_store/), so both keep one policy.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from a2a.types import a2a_pb2
from django.db import connection, transaction
from django.utils import timezone
from google.protobuf import json_format

from agents.models import OperatorAction
from tasks import services
from tasks.models import Task, TaskEvent
from tasks.states import TaskState
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory, task_create, user_message
from tests.locks import held_open, in_thread, wait_for_a_lock_waiter
from webhooks.delivery import outbox_store
from webhooks.delivery.claim_record import (
    delivery_claim_batch,
    delivery_record_many,
)
from webhooks.delivery.retention import purge_old_rows
from webhooks.delivery.transport import TransportResult
from webhooks.models import (
    Alert,
    AlertKind,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    PushConfig,
)
from webhooks.services import (
    delivery_replay,
    endpoint_pause,
    endpoint_resume,
    push_config_create,
)
from webhooks.services import push_config_delete as delete_config

pytestmark = pytest.mark.usefixtures("public_dns", "outbox")

HOOK = "https://hooks.example.org/a2a"
T0 = datetime(2030, 1, 15, 12, 0, tzinfo=UTC)


@pytest.fixture
def agent(db):
    """Tests that need real commits (threads, rollbacks) also ask for `transactional_db`."""
    return AgentFactory(executor="external")


@pytest.fixture(params=["postgres", "orm"])
def outbox(request, settings):
    settings.A2A_STORE = request.param
    expected = {"postgres": outbox_store.PgOutboxStore, "orm": outbox_store.OrmOutboxStore}
    assert isinstance(outbox_store.get_outbox_store(), expected[request.param])
    return request.param


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(T0, tick=False)
    return time_machine


@pytest.fixture
def schedules(settings):
    settings.A2A_WEBHOOK_RETRY_SCHEDULE = ["10", "100"]
    settings.A2A_WEBHOOK_AUTH_RETRY_SCHEDULE = ["60", "120"]
    return settings


def new_task(agent, owner: str = "owner") -> Task:
    return task_create(agent=agent, owner=owner, message=user_message("hi"))


def register(task: Task, config_id: str, url: str = HOOK, **config) -> PushConfig:
    binding = push_config_create(task=task, config={"id": config_id, "url": url, **config})
    return binding.config


def result(
    status: int | None = 200, *, error: str | None = None, retry_after: float | None = None
) -> TransportResult:
    return TransportResult(
        status=status,
        headers={},
        body_excerpt="",
        duration_ms=3.0,
        error_class=error,
        retry_after=retry_after,
    )


def deliveries(push: PushConfig) -> list[Delivery]:
    return list(Delivery.objects.filter(config=push).order_by("id"))


def seconds_until(delivery: Delivery) -> float:
    """How long from now (the frozen clock) until the delivery is due."""
    delivery.refresh_from_db()
    return (delivery.next_attempt_at - timezone.now()).total_seconds()


# --- Writing the outbox ------------------------------------------------------------------


def test_every_status_and_artifact_event_writes_one_delivery_per_current_binding(agent):
    agent.push_rebind_policy = "cutover"  # the re-registration below switches at once
    agent.save()
    task = new_task(agent)
    a = register(task, "a")
    b = register(task, "b", url="https://b.example.org/hook")
    a = register(task, "a", url="https://a2.example.org/hook")  # rebind: a is now v2
    current = {a.pk: a.bindings.get(version=2).pk, b.pk: b.bindings.get(version=1).pk}
    retired = a.bindings.get(version=1).pk

    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING, message="on it")
    services.task_add_artifact(
        task_id=task.pk, artifact={"artifactId": "r", "parts": [{"text": "partial"}]}
    )
    services.task_append_message(
        task_id=task.pk, message={**user_message("aside"), "role": "ROLE_AGENT"}
    )
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)

    events = {e.seq: e for e in TaskEvent.objects.filter(task=task)}
    assert [events[s].kind for s in sorted(events)] == [
        "status",
        "status",
        "artifact",
        "message",
        "status",
    ]
    for seq in (2, 3, 5):
        rows = Delivery.objects.filter(task=task, seq=seq)
        assert {(r.config_id, r.binding_id) for r in rows} == set(current.items())
        assert {r.kind for r in rows} == {events[seq].kind}
    assert not Delivery.objects.filter(task=task, seq=4).exists()  # the message event
    assert not Delivery.objects.filter(binding_id=retired).exclude(kind="snapshot").exists()


def test_an_event_makes_a_config_due_now_unless_its_head_is_scheduled(agent, clock):
    task = new_task(agent)
    idle, waiting = register(task, "idle"), register(task, "waiting")
    Delivery.objects.filter(task=task).update(state=DeliveryState.DELIVERED)  # the snapshots
    later = T0 + timedelta(seconds=300)  # e.g. a head waiting for its retry
    PushConfig.objects.filter(pk=idle.pk).update(head_due_at=None)
    PushConfig.objects.filter(pk=waiting.pk).update(head_due_at=later)
    clock.move_to(T0 + timedelta(seconds=5))

    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)

    idle.refresh_from_db()
    waiting.refresh_from_db()
    assert idle.head_due_at == T0 + timedelta(seconds=5)
    assert waiting.head_due_at == later
    new = Delivery.objects.get(config=idle, seq=2)
    assert (new.state, new.attempts, new.next_attempt_at) == ("pending", 0, idle.head_due_at)
    assert new.event_id != Delivery.objects.get(config=waiting, seq=2).event_id


class Abort(Exception):
    """Raised inside the transaction, carrying what was visible there."""

    def __init__(self, seen: tuple[int, int]) -> None:
        super().__init__("the surrounding transaction fails")
        self.seen = seen


def change_then_abort(task: Task, push: PushConfig, change) -> None:
    with transaction.atomic():
        change()
        seen = (
            TaskEvent.objects.filter(task=task, seq=2).count(),
            Delivery.objects.filter(config=push, seq=2).count(),
        )
        raise Abort(seen)


def test_outbox_rows_roll_back_with_the_event(transactional_db, agent):
    task = new_task(agent)
    push = register(task, "a")
    before = (TaskEvent.objects.filter(task=task).count(), Delivery.objects.count())

    for change in (
        lambda: services.task_transition(task_id=task.pk, to_state=TaskState.WORKING),
        lambda: services.task_add_artifact(
            task_id=task.pk, artifact={"artifactId": "r", "parts": [{"text": "x"}]}
        ),
    ):
        with pytest.raises(Abort) as aborted:
            change_then_abort(task, push, change)
        # Inside the transaction the event and its delivery existed together...
        assert aborted.value.seen == (1, 1)
        # ...and neither survives the rollback.
        assert (TaskEvent.objects.filter(task=task).count(), Delivery.objects.count()) == before
        assert not Delivery.objects.filter(seq=2).exists()
    task.refresh_from_db()
    assert (task.state, task.last_seq) == (TaskState.SUBMITTED, 1)


def test_message_events_write_no_delivery(agent):
    task = new_task(agent)
    push = register(task, "a")
    services.task_append_message(
        task_id=task.pk, message={**user_message("note"), "role": "ROLE_AGENT"}
    )
    services.task_append_message(task_id=task.pk, message=user_message("more"))
    assert TaskEvent.objects.filter(task=task, kind="message").count() == 2
    assert [d.kind for d in deliveries(push)] == ["snapshot"]


def test_deleted_configs_get_nothing(agent):
    task = new_task(agent)
    gone = register(task, "gone")
    kept = register(task, "kept")
    delete_config(task=task, config_id="gone")
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    services.task_add_artifact(
        task_id=task.pk, artifact={"artifactId": "r", "parts": [{"text": "x"}]}
    )
    assert [(d.kind, d.state) for d in deliveries(gone)] == [("snapshot", DeliveryState.CANCELED)]
    assert [d.kind for d in deliveries(kept)] == ["snapshot", "status", "artifact"]


def test_delivery_body_is_the_stream_response_of_the_event(agent):
    task = new_task(agent)
    push = register(task, "a")
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING, message="gr\u00fc\u00dfe")
    services.task_add_artifact(
        task_id=task.pk,
        artifact={"artifactId": "r", "name": "r\u00e9sum\u00e9", "parts": [{"text": "\u2713"}]},
        last_chunk=True,
    )
    snapshot, status, artifact = deliveries(push)

    for delivery in (status, artifact):
        event = TaskEvent.objects.get(task=task, seq=delivery.seq)
        assert json.loads(delivery.body) == event.payload
        # A valid lf.a2a.v1.StreamResponse, strictly (no unknown fields), as sent.
        parsed = json_format.Parse(delivery.body, a2a_pb2.StreamResponse())
        expected = "status_update" if delivery.kind == "status" else "artifact_update"
        assert parsed.WhichOneof("payload") == expected
    status_json = json.loads(status.body)["statusUpdate"]
    assert status_json["taskId"] == str(task.pk)
    assert status_json["status"]["state"] == "TASK_STATE_WORKING"
    assert status_json["status"]["message"]["parts"] == [{"text": "gr\u00fc\u00dfe"}]
    assert "gr\u00fc\u00dfe" in status.body  # UTF-8 text, not \\u escapes
    assert json.loads(artifact.body)["artifactUpdate"]["lastChunk"] is True

    task_json = json.loads(snapshot.body)["task"]
    json_format.Parse(snapshot.body, a2a_pb2.StreamResponse())
    assert (task_json["id"], task_json["status"]["state"]) == (
        str(task.pk),
        "TASK_STATE_SUBMITTED",
    )


def test_registration_racing_transitions_misses_nothing(transactional_db, agent):
    """A config registered while another thread moves the task gets the snapshot at some seq
    s and a delivery for every event after s: none missing, none twice."""
    overlapped = []
    for threshold in (3, 9, 15):
        task = new_task(agent)
        errors: list[BaseException] = []
        go = threading.Barrier(2)

        def transitions(task=task, errors=errors, go=go):
            try:
                go.wait()
                for i in range(20):
                    services.task_transition(
                        task_id=task.pk, to_state=TaskState.WORKING, message=f"step {i}"
                    )
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)
            finally:
                connection.close()

        def registration(task=task, errors=errors, go=go, threshold=threshold):
            try:
                go.wait()
                while Task.objects.get(pk=task.pk).last_seq < threshold:
                    time.sleep(0.001)
                push_config_create(task=task, config={"id": "late", "url": HOOK})
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=transitions), threading.Thread(target=registration)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors

        task.refresh_from_db()
        assert task.last_seq == 21
        push = PushConfig.objects.get(task=task, config_id="late")
        rows = deliveries(push)
        snapshot = rows[0]
        assert snapshot.kind == "snapshot"
        s = snapshot.seq
        assert s >= threshold
        assert [r.seq for r in rows] == [s, *range(s + 1, task.last_seq + 1)]
        assert all(r.kind == "status" for r in rows[1:])
        # The snapshot shows the task exactly as event s left it.
        event_s = TaskEvent.objects.get(task=task, seq=s)
        assert (
            json.loads(snapshot.body)["task"]["status"] == event_s.payload["statusUpdate"]["status"]
        )
        for row in rows[1:]:
            event = TaskEvent.objects.get(task=task, seq=row.seq)
            assert json.loads(row.body) == event.payload
        overlapped.append(s < task.last_seq)
    assert any(overlapped), "no registration landed mid-stream"


def test_registration_racing_an_answer_from_the_claims_row_misses_nothing(transactional_db, agent):
    """The echo executor's answer is written from the task row its claim read, without
    locking the task first. A config registered meanwhile (its transaction holding the task
    row) makes the answer's write wait; once it commits, the answer's outbox write sees it:
    the snapshot at seq 1, then a delivery for each event of the answer."""
    task = new_task(agent)
    seen = Task.objects.get(pk=task.pk)  # as the quick claim read it
    echo = {"artifactId": "echo", "parts": [{"text": "hi"}]}
    with held_open(lambda: register(task, "racing")) as registered:
        answer = in_thread(lambda: services.task_answer(task_id=task.pk, artifact=echo, seen=seen))
        wait_for_a_lock_waiter()
    assert isinstance(answer(), Task)
    push = registered[0]
    assert [(d.seq, d.kind) for d in deliveries(push)] == [
        (1, "snapshot"),
        (2, "status"),
        (3, "artifact"),
        (4, "status"),
    ]


def test_registration_racing_a_batch_of_answers_misses_nothing(transactional_db):
    """A batch of quick answers writes its outbox rows once, at its end (hooks_together).
    A config registered for one of its tasks meanwhile (its transaction holding that task's
    row) makes the batch wait at that task's answer; once it commits, the batch's one outbox
    write sees it: the snapshot at seq 1, then each event of the answer. The batch's other
    tasks are answered in the same transaction."""
    from tasks.dispatch import dispatch_claim_due
    from tasks.executors import runner

    echo = AgentFactory(executor="echo")
    tasks = sorted((new_task(echo) for _ in range(3)), key=lambda task: str(task.pk))
    claims = dispatch_claim_due(worker="w1", limit=3)
    assert len(claims) == 3
    with held_open(lambda: register(tasks[1], "racing")) as registered:
        batch = in_thread(lambda: runner._run_together(claims, "w1"))
        wait_for_a_lock_waiter()
    assert batch() is None
    assert [(d.seq, d.kind) for d in deliveries(registered[0])] == [
        (1, "snapshot"),
        (2, "status"),
        (3, "artifact"),
        (4, "status"),
    ]
    answered = TaskEvent.objects.filter(task__in=tasks, seq=4)
    assert len({event.task_id for event in answered}) == 3
    # One transaction: the batch was not rolled back and run again task by task.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(DISTINCT xmin::text) FROM tasks_taskevent WHERE task_id = ANY(%s)"
            " AND seq > 1",
            [[task.pk for task in tasks]],
        )
        assert cursor.fetchone()[0] == 1


# --- Claiming and recording --------------------------------------------------------------


def test_claims_go_in_order_per_config(agent, clock, schedules):
    task = new_task(agent)
    push = register(task, "a")
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    head, second = deliveries(push)

    claim = delivery_claim_head(config_pk=push.pk)
    assert claim.delivery_pk == head.pk
    assert claim.headers["webhook-id"] == str(head.event_id)
    assert claim.headers["X-A2A-Task-Seq"] == "1"
    assert claim.body == head.body.encode()
    assert delivery_record(claim=claim, result=result(500)).state == "retry"
    # The head waits for its retry, and the next delivery waits behind it though it is due.
    second.refresh_from_db()
    assert second.next_attempt_at <= T0
    assert delivery_claim_head(config_pk=push.pk) is None

    clock.shift(seconds_until(head) + 1)
    again = delivery_claim_head(config_pk=push.pk)
    assert (again.delivery_pk, again.attempt_number) == (head.pk, 2)
    assert delivery_record(claim=again, result=result(204)).state == "delivered"
    nxt = delivery_claim_head(config_pk=push.pk)
    assert nxt.delivery_pk == second.pk
    assert delivery_record(claim=nxt, result=result(200)).state == "delivered"
    assert delivery_claim_head(config_pk=push.pk) is None
    assert [d.state for d in deliveries(push)] == [DeliveryState.DELIVERED] * 2
    attempts = list(DeliveryAttempt.objects.filter(delivery=head).order_by("number"))
    assert [(a.number, a.status) for a in attempts] == [(1, 500), (2, 204)]


def test_configs_do_not_wait_for_each_other(agent, clock, schedules):
    task = new_task(agent)
    slow = register(task, "slow")
    fast = register(task, "fast", url="https://fast.example.org/")
    claim = delivery_claim_head(config_pk=slow.pk)
    delivery_record(claim=claim, result=result(503))
    other = delivery_claim_head(config_pk=fast.pk)
    assert other is not None
    assert other.config_pk == fast.pk


def test_lease_gives_at_least_once(agent, clock, schedules):
    task = new_task(agent)
    push = register(task, "a")
    (delivery,) = deliveries(push)

    first = delivery_claim_head(config_pk=push.pk)
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.SENDING
    lease = seconds_until(delivery)
    assert lease > 0
    assert delivery_claim_head(config_pk=push.pk) is None  # in flight

    clock.shift(lease - 1)
    assert delivery_claim_head(config_pk=push.pk) is None
    clock.shift(2)  # the first worker died mid-send: its lease passed
    second = delivery_claim_head(config_pk=push.pk)
    assert (second.delivery_pk, second.attempt_number) == (delivery.pk, 2)
    assert second.headers["webhook-id"] == first.headers["webhook-id"]
    # A late answer of the first attempt is stale; the second one decides.
    assert delivery_record(claim=first, result=result(200)).state == "stale"
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.SENDING
    assert delivery_record(claim=second, result=result(200)).state == "delivered"
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == (
        DeliveryState.DELIVERED,
        2,
        200,
    )


def test_claim_skips_a_config_another_claimer_has_locked(transactional_db, agent):
    task = new_task(agent)
    push = register(task, "a")
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    head, behind = deliveries(push)
    with held_open(lambda: PushConfig.objects.select_for_update().get(pk=push.pk)):
        started = time.monotonic()
        # Skipped, not waited for, and the delivery behind it is not taken out of order.
        assert delivery_claim_head(config_pk=push.pk) is None
        assert time.monotonic() - started < 2
    assert delivery_claim_head(config_pk=push.pk).delivery_pk == head.pk


def test_a_batch_claims_one_head_per_config_within_endpoint_caps(agent, clock, schedules, settings):
    settings.A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT = 2
    tasks = [new_task(agent) for _ in range(3)]
    shared = [register(task, "a") for task in tasks]  # three configs, one endpoint
    other = register(tasks[0], "b", url="https://other.example.org/")
    for task in tasks:  # a second delivery behind every head
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)

    claims = delivery_claim_batch(limit=10).claims
    # One head per config; the shared endpoint's cap (2) leaves its third config waiting.
    assert [c.config_pk for c in claims] == [shared[0].pk, shared[1].pk, other.pk]
    assert [c.delivery_pk for c in claims] == [
        deliveries(push)[0].pk for push in (shared[0], shared[1], other)
    ]
    assert delivery_claim_batch(limit=10).claims == ()  # heads in flight; the third config at cap

    outcomes = delivery_record_many(
        [(claims[0], result(200)), (claims[1], result(503)), (claims[2], result(404))]
    )
    assert [o.state for o in outcomes] == ["delivered", "retry", "dead"]
    assert [d.state for d in deliveries(shared[0])] == [
        DeliveryState.DELIVERED,
        DeliveryState.PENDING,
    ]
    assert deliveries(shared[1])[0].state == DeliveryState.PENDING
    assert deliveries(other)[0].state == DeliveryState.DEAD
    attempts = DeliveryAttempt.objects.filter(pk__in=[c.attempt_pk for c in claims])
    assert sorted(a.status for a in attempts) == [200, 404, 503]
    # A failure in the batch makes the shared endpoint a failing one: one try in flight.
    shared_endpoint = Endpoint.objects.get(origin="https://hooks.example.org:443")
    assert shared_endpoint.consecutive_failures == 1
    nxt = delivery_claim_batch(limit=10).claims
    on_shared = [c for c in nxt if c.config_pk in {push.pk for push in shared}]
    assert len(on_shared) == 1
    assert [c.delivery_pk for c in nxt if c.config_pk == other.pk] == [deliveries(other)[1].pk]


def test_an_endpoint_failing_in_a_row_raises_an_alert_its_next_success_resolves(
    agent, clock, schedules, settings
):
    settings.A2A_WEBHOOK_ENDPOINT_FAILING_AFTER = 2
    task = new_task(agent)
    push = register(task, "a")
    (delivery,) = deliveries(push)
    delivery_record(claim=delivery_claim_head(config_pk=push.pk), result=result(503))
    assert not Alert.objects.filter(kind=AlertKind.ENDPOINT_FAILING).exists()

    clock.shift(seconds_until(delivery) + 1)
    failure = result(None, error="connect")
    delivery_record(claim=delivery_claim_head(config_pk=push.pk), result=failure)
    alert = Alert.objects.get(kind=AlertKind.ENDPOINT_FAILING)
    assert alert.resolved_at is None
    assert "failed 2 deliveries in a row" in alert.message

    clock.shift(seconds_until(delivery) + 1)
    delivery_record(claim=delivery_claim_head(config_pk=push.pk), result=result(200))
    alert.refresh_from_db()
    assert alert.resolved_at == timezone.now()  # resolved by the success (frozen clock)
    assert Endpoint.objects.get(pk=alert.endpoint_id).consecutive_failures == 0


def test_a_saturated_endpoint_does_not_starve_the_others(agent, clock, schedules, settings):
    settings.A2A_WEBHOOK_ENDPOINT_MAX_IN_FLIGHT = 1
    task = new_task(agent)
    busy = [register(task, f"busy-{i}") for i in range(3)]  # the longest-waiting heads
    calm = register(task, "calm", url="https://calm.example.org/")

    first = delivery_claim_batch(limit=2).claims
    assert [c.config_pk for c in first] == [busy[0].pk]  # busy-1 waits: its endpoint is at cap
    # The busy endpoint's other heads step back instead of filling the next batch again.
    second = delivery_claim_batch(limit=2).claims
    assert [c.config_pk for c in second] == [calm.pk]
    for push in busy[1:]:
        assert deliveries(push)[0].attempts == 0  # waiting spent no try
    clock.shift(settings.A2A_WEBHOOK_CAP_WAIT_SECONDS + 0.01)
    assert delivery_claim_batch(limit=5).claims == ()  # still at cap: busy-0 is in flight
    delivery_record(claim=first[0], result=result(200))
    clock.shift(settings.A2A_WEBHOOK_CAP_WAIT_SECONDS + 0.01)
    assert [c.config_pk for c in delivery_claim_batch(limit=5).claims] == [busy[1].pk]


@pytest.mark.parametrize(
    "failure",
    [result(500), result(503), result(429), result(408), result(None, error="connect")],
    ids=["500", "503", "429", "408", "connect"],
)
def test_transient_failures_retry_on_the_schedule(agent, clock, schedules, failure):
    task = new_task(agent)
    push = register(task, "a")
    (delivery,) = deliveries(push)

    claim = delivery_claim_head(config_pk=push.pk)
    outcome = delivery_record(claim=claim, result=failure)
    assert outcome.state == "retry"
    delivery.refresh_from_db()
    assert delivery.state == DeliveryState.PENDING
    assert 8 <= seconds_until(delivery) <= 12  # 10 s, jittered by ±20 %
    assert outcome.retry_in == pytest.approx(seconds_until(delivery))
    assert delivery.finished_at is None

    clock.shift(seconds_until(delivery) + 0.001)
    claim = delivery_claim_head(config_pk=push.pk)
    assert delivery_record(claim=claim, result=failure).state == "retry"
    assert 80 <= seconds_until(delivery) <= 120

    clock.shift(seconds_until(delivery) + 0.001)
    claim = delivery_claim_head(config_pk=push.pk)
    assert delivery_record(claim=claim, result=failure).state == "dead"  # schedule exhausted
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == (DeliveryState.DEAD, 3)
    assert delivery.finished_at == timezone.now()
    alert = Alert.objects.get(kind=AlertKind.DEAD_LETTER)
    assert alert.endpoint.origin == "https://hooks.example.org:443"
    assert str(delivery.event_id) in alert.message
    assert Endpoint.objects.get().consecutive_failures == 3


def test_retry_after_lengthens_the_wait_but_never_shortens_it(agent, clock, schedules):
    task = new_task(agent)
    push = register(task, "a")
    (delivery,) = deliveries(push)

    claim = delivery_claim_head(config_pk=push.pk)
    delivery_record(claim=claim, result=result(429, retry_after=50))
    assert seconds_until(delivery) == 50

    clock.move_to(delivery.next_attempt_at, tick=False)
    claim = delivery_claim_head(config_pk=push.pk)
    delivery_record(claim=claim, result=result(503, retry_after=1))
    now = delivery.next_attempt_at
    delivery.refresh_from_db()
    assert 80 <= (delivery.next_attempt_at - now).total_seconds() <= 120


def test_retry_after_is_capped_at_a_day(agent, clock, settings):
    settings.A2A_WEBHOOK_RETRY_SCHEDULE = ["1"]
    task = new_task(agent)
    push = register(task, "a")
    claim = delivery_claim_head(config_pk=push.pk)
    delivery_record(claim=claim, result=result(503, retry_after=10_000_000))
    assert seconds_until(deliveries(push)[0]) == 86400


@pytest.mark.parametrize("status", [401, 403])
def test_auth_rejection_uses_the_auth_schedule_and_alerts(agent, clock, schedules, status):
    task = new_task(agent)
    push = register(task, "a")
    (delivery,) = deliveries(push)

    claim = delivery_claim_head(config_pk=push.pk)
    assert delivery_record(claim=claim, result=result(status)).state == "retry"
    assert 48 <= seconds_until(delivery) <= 72  # 60 s, not the 10 s of the normal schedule
    alert = Alert.objects.get(kind=AlertKind.AUTH_REJECTED)
    assert alert.endpoint == delivery.binding.endpoint
    assert str(status) in alert.message
    assert alert.count == 1

    clock.shift(seconds_until(delivery) + 0.001)
    claim = delivery_claim_head(config_pk=push.pk)
    assert delivery_record(claim=claim, result=result(status)).state == "retry"
    assert Alert.objects.get(kind=AlertKind.AUTH_REJECTED).count == 2  # one alert, counted

    clock.shift(seconds_until(delivery) + 0.001)
    claim = delivery_claim_head(config_pk=push.pk)
    assert delivery_record(claim=claim, result=result(status)).state == "dead"
    assert Alert.objects.filter(kind=AlertKind.DEAD_LETTER).count() == 1


def test_auth_rejections_and_other_failures_count_against_their_own_schedules(
    agent, clock, schedules
):
    # Schedules here: other failures wait 10 then 100 s (3 tries), auth rejections 60 then
    # 120 s (3 tries). A receiver down a while that then rejects the signature still gets
    # its auth retries, and those do not use up the outage schedule.
    task = new_task(agent)
    push = register(task, "a")
    (delivery,) = deliveries(push)

    def attempt(status: int) -> str:
        clock.shift(max(seconds_until(delivery), 0) + 0.001)
        claim = delivery_claim_head(config_pk=push.pk)
        return delivery_record(claim=claim, result=result(status)).state

    assert attempt(500) == "retry"
    assert 8 <= seconds_until(delivery) <= 12
    assert attempt(500) == "retry"
    assert 80 <= seconds_until(delivery) <= 120
    assert attempt(401) == "retry"  # the first rejection: the auth schedule's first wait
    assert 48 <= seconds_until(delivery) <= 72
    assert attempt(403) == "retry"
    assert 96 <= seconds_until(delivery) <= 144
    assert attempt(500) == "dead"  # the third try of the other kind: its schedule is spent
    delivery.refresh_from_db()
    assert delivery.attempts == 5


@pytest.mark.parametrize(
    "final",
    [result(404), result(410), result(400), result(None, error="ssrf")],
    ids=["404", "410", "400", "ssrf"],
)
def test_final_failures_are_dead_at_once_and_the_next_delivery_goes(agent, clock, schedules, final):
    task = new_task(agent)
    push = register(task, "a")
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    head, second = deliveries(push)

    claim = delivery_claim_head(config_pk=push.pk)
    assert delivery_record(claim=claim, result=final).state == "dead"
    head.refresh_from_db()
    assert (head.state, head.attempts, head.finished_at) == (DeliveryState.DEAD, 1, T0)
    assert Alert.objects.filter(kind=AlertKind.DEAD_LETTER, endpoint=head.binding.endpoint).exists()
    nxt = delivery_claim_head(config_pk=push.pk)
    assert nxt.delivery_pk == second.pk


def test_a_paused_endpoints_deliveries_wait(agent, clock, schedules):
    task = new_task(agent)
    push = register(task, "a")
    (delivery,) = deliveries(push)
    endpoint = delivery.binding.endpoint

    endpoint_pause(endpoint_pk=endpoint.pk, actor="ops")
    assert delivery_claim_head(config_pk=push.pk) is None
    clock.shift(timedelta(days=3))
    assert delivery_claim_head(config_pk=push.pk) is None
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == (DeliveryState.PENDING, 0)
    assert not Alert.objects.exists()

    endpoint_resume(endpoint_pk=endpoint.pk, actor="ops")
    claim = delivery_claim_head(config_pk=push.pk)
    assert claim.delivery_pk == delivery.pk
    actions = list(OperatorAction.objects.order_by("id").values_list("action", "actor"))
    assert actions == [("pause_endpoint", "ops"), ("resume_endpoint", "ops")]


def test_replay_reopens_dead_and_delivered_with_the_same_event_id(agent, clock, schedules):
    task = new_task(agent)
    push = register(task, "a")
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    dead, delivered, pending = deliveries(push)
    delivery_record(claim=delivery_claim_head(config_pk=push.pk), result=result(404))
    delivery_record(claim=delivery_claim_head(config_pk=push.pk), result=result(200))
    dead.refresh_from_db()
    delivered.refresh_from_db()
    assert (dead.state, delivered.state) == (DeliveryState.DEAD, DeliveryState.DELIVERED)

    clock.shift(60)
    count = delivery_replay(delivery_pks=[dead.pk, delivered.pk, pending.pk], actor="ops@example")
    assert count == 2  # the pending one is not replayed
    for row, before in ((dead, dead.event_id), (delivered, delivered.event_id)):
        row.refresh_from_db()
        assert (row.state, row.event_id, row.finished_at) == (DeliveryState.PENDING, before, None)
        assert row.next_attempt_at == T0 + timedelta(seconds=60)
    action = OperatorAction.objects.get(action="replay_deliveries")
    assert action.actor == "ops@example"
    assert sorted(action.target["deliveries"]) == sorted(
        [str(dead.event_id), str(delivered.event_id)]
    )

    # Replayed in order, with the ids a receiver already knows (it may dedupe on them).
    sent = []
    while (claim := delivery_claim_head(config_pk=push.pk)) is not None:
        sent.append(claim.headers["webhook-id"])
        assert delivery_record(claim=claim, result=result(200)).state == "delivered"
    assert sent == [str(dead.event_id), str(delivered.event_id), str(pending.event_id)]
    # The timeline marks the replay's tries as an operator's.
    timeline = DeliveryAttempt.objects.filter(delivery__in=[dead, delivered, pending])
    assert sorted(timeline.values_list("delivery_id", "number", "manual")) == sorted(
        [
            (dead.pk, 1, False),
            (dead.pk, 2, True),
            (delivered.pk, 1, False),
            (delivered.pk, 2, True),
            (pending.pk, 1, False),
        ]
    )


def test_replay_skips_deliveries_of_a_deleted_config(agent, clock, schedules):
    task = new_task(agent)
    push = register(task, "a")
    delivery_record(claim=delivery_claim_head(config_pk=push.pk), result=result(200))
    delete_config(task=task, config_id="a")
    (delivered,) = deliveries(push)
    assert delivery_replay(delivery_pks=[delivered.pk], actor="ops") == 0
    delivered.refresh_from_db()
    assert delivered.state == DeliveryState.DELIVERED


# --- Retention -----------------------------------------------------------------------------


def test_purge_deletes_old_delivered_rows_and_events_of_finished_tasks_only(
    agent, clock, schedules, settings
):
    settings.A2A_RETENTION_DAYS = 14
    old = T0 - timedelta(days=20)
    clock.move_to(old, tick=False)
    finished = new_task(agent)
    live = new_task(agent)
    delivered = register(finished, "delivered")
    dead = register(finished, "dead", url="https://dead.example.org/")
    pending = register(live, "pending", url="https://slow.example.org/")
    canceled = register(live, "canceled")
    delivery_record(claim=delivery_claim_head(config_pk=delivered.pk), result=result(200))
    delivery_record(claim=delivery_claim_head(config_pk=dead.pk), result=result(404))
    delete_config(task=live, config_id="canceled")
    services.task_transition(task_id=finished.pk, to_state=TaskState.WORKING)
    services.task_transition(task_id=live.pk, to_state=TaskState.WORKING)

    clock.move_to(T0, tick=False)
    services.task_transition(task_id=finished.pk, to_state=TaskState.COMPLETED)  # finished now
    recent = new_task(agent)
    services.task_transition(task_id=recent.pk, to_state=TaskState.COMPLETED)
    recent_push = register(recent, "recent")
    delivery_record(claim=delivery_claim_head(config_pk=recent_push.pk), result=result(200))
    old_delivered = deliveries(delivered)[0]
    assert DeliveryAttempt.objects.filter(delivery=old_delivered).count() == 1

    purged = purge_old_rows()

    assert purged.deliveries == 2  # the old delivered one and the old canceled one
    assert not Delivery.objects.filter(pk=old_delivered.pk).exists()
    assert not DeliveryAttempt.objects.filter(delivery_id=old_delivered.pk).exists()
    assert not Delivery.objects.filter(config=canceled).exists()
    assert [d.state for d in deliveries(dead)] == [DeliveryState.DEAD] + [DeliveryState.PENDING] * 2
    assert [d.state for d in deliveries(pending)] == [DeliveryState.PENDING] * 2
    assert deliveries(recent_push)[0].state == DeliveryState.DELIVERED
    # Events: the finished task loses those older than the cutoff; a live task keeps all.
    assert purged.events == 2
    assert list(TaskEvent.objects.filter(task=finished).values_list("seq", flat=True)) == [3]
    assert list(
        TaskEvent.objects.filter(task=live).order_by("seq").values_list("seq", flat=True)
    ) == [1, 2]
    assert TaskEvent.objects.filter(task=recent).count() == 2
    assert purge_old_rows() == type(purged)(0, 0)  # nothing left to purge
