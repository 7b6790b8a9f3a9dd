"""Lifecycle services on PostgreSQL: one transaction each, events gap-free, rules enforced.

Every test runs through both task stores (tasks/task_store/): the prepared statements
production runs and the ORM twin the embedded SQLite database runs.
"""

import pytest
from django.db import connection, transaction

from tasks import selectors, services, task_store, wire
from tasks.errors import InvalidPayload, TaskNotFound, TaskTerminal
from tasks.models import DispatchState, ExecutorDispatch, MessageReceipt, Task, TaskEvent
from tasks.state_machine import IllegalTransition
from tasks.states import TaskState
from tests.factories import task_create, user_message

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True, params=["postgres", "orm"])
def store(request, settings):
    """Every caller of the task store follows the switch (tasks.task_store.get_task_store)."""
    settings.A2A_STORE = request.param
    expected = {"postgres": task_store.PgTaskStore, "orm": task_store.OrmTaskStore}
    assert type(task_store.get_task_store()) is expected[request.param]
    return request.param


def test_task_create_writes_task_message_event_and_dispatch(
    agent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        task = task_create(agent=agent, owner="anonymous", message=user_message("hi"))
    assert task.state == TaskState.SUBMITTED
    assert task.last_seq == 1
    event = TaskEvent.objects.get(task=task)
    assert event.seq == 1
    assert event.payload["statusUpdate"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert task.messages.get().parts == [{"text": "hi"}]
    dispatch = task.dispatches.get()
    assert dispatch.state == DispatchState.PENDING
    assert dispatch.enqueues == 1
    assert len(callbacks) == 1  # the executor job, published only after commit


def test_task_create_rejects_agent_role_and_empty_parts(agent):
    with pytest.raises(InvalidPayload) as exc:
        task_create(agent=agent, owner="a", message={**user_message(), "role": "ROLE_AGENT"})
    assert exc.value.field == "message.role"
    with pytest.raises(InvalidPayload) as exc:
        task_create(agent=agent, owner="a", message={**user_message(), "parts": []})
    assert exc.value.field == "message.parts"
    with pytest.raises(InvalidPayload):
        task_create(agent=agent, owner="a", message={**user_message(), "parts": [{}]})
    assert Task.objects.count() == 0


def test_task_transition_appends_ordered_events(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    services.task_transition(task_id=task.id, to_state=TaskState.WORKING, message="thinking")
    services.task_add_artifact(
        task_id=task.id, artifact={"artifactId": "a1", "parts": [{"text": "x"}]}
    )
    done = services.task_transition(task_id=task.id, to_state=TaskState.COMPLETED)
    assert done.last_seq == 4
    kinds = list(TaskEvent.objects.filter(task=task).order_by("seq").values_list("seq", "kind"))
    assert kinds == [(1, "status"), (2, "status"), (3, "artifact"), (4, "status")]
    assert not task.dispatches.filter(state__in=["pending", "claimed"]).exists()


def test_task_transition_illegal_move_changes_nothing(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    services.task_transition(task_id=task.id, to_state=TaskState.COMPLETED)
    with pytest.raises(IllegalTransition) as exc:
        services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
    assert exc.value.terminal
    task.refresh_from_db()
    assert task.state == TaskState.COMPLETED
    assert task.last_seq == 2
    assert TaskEvent.objects.filter(task=task).count() == 2


def test_task_transition_unknown_task(agent):
    with pytest.raises(TaskNotFound):
        services.task_transition(task_id="not-a-uuid", to_state=TaskState.WORKING)
    with pytest.raises(TaskNotFound):
        services.task_transition(
            task_id="00000000-0000-0000-0000-000000000000", to_state=TaskState.WORKING
        )


def test_task_add_artifact_assembles_chunks(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    for i in range(3):
        services.task_add_artifact(
            task_id=task.id,
            artifact={"artifactId": "big", "parts": [{"text": f"c{i}"}]},
            append=i > 0,
            last_chunk=i == 2,
        )
    art = task.artifacts.get()
    assert art.parts == [{"text": "c0"}, {"text": "c1"}, {"text": "c2"}]
    assert art.complete
    assert art.chunks == 3
    with pytest.raises(InvalidPayload):
        services.task_add_artifact(
            task_id=task.id,
            artifact={"artifactId": "big", "parts": [{"text": "late"}]},
            append=True,
        )


def test_task_append_message_continues_and_refuses_terminal(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    services.task_transition(task_id=task.id, to_state=TaskState.INPUT_REQUIRED, message="more?")
    task.dispatches.update(state=DispatchState.DONE)
    services.task_append_message(task_id=task.id, message=user_message("more"))
    assert task.dispatches.filter(state=DispatchState.PENDING).count() == 1
    with pytest.raises(InvalidPayload):
        services.task_append_message(
            task_id=task.id, message=user_message("x", contextId="other-context")
        )
    services.task_transition(task_id=task.id, to_state=TaskState.CANCELED)
    with pytest.raises(TaskTerminal):
        services.task_append_message(task_id=task.id, message=user_message("late"))


def test_task_cancel_terminal_is_not_cancelable(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    services.task_cancel(task_id=task.id)
    with pytest.raises(IllegalTransition) as exc:
        services.task_cancel(task_id=task.id)
    assert exc.value.terminal


def test_status_timestamp_strictly_increases(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    stamps = [task.status_timestamp]
    for _ in range(20):
        task = services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
        stamps.append(task.status_timestamp)
    assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False))


def test_notify_is_sent_once_per_task_per_transaction(agent, transactional_db):
    """Several events of one task in one transaction wake listeners once (PG folds them)."""
    import psycopg

    from tests.processes import test_database_url

    task = task_create(agent=agent, owner="a", message=user_message())
    with psycopg.connect(test_database_url(), autocommit=True) as listener:
        listener.execute("LISTEN a2a_task_events")
        with transaction.atomic():
            services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
            services.task_add_artifact(
                task_id=task.id, artifact={"artifactId": "a", "parts": [{"text": "x"}]}
            )
            services.task_transition(task_id=task.id, to_state=TaskState.COMPLETED)
        notes = list(listener.notifies(timeout=1.0))
    assert [n.payload for n in notes] == [str(task.id)]
    assert connection.vendor == "postgresql"


def test_lifecycle_writes_read_back_as_the_orm_wrote_them(agent):
    """What a service returns is what is stored: status message JSON (and its absence),
    answered_with_message, last seq, updated_at, and the event rows' payloads."""
    task = task_create(agent=agent, owner="a", message=user_message())
    working = services.task_transition(task_id=task.id, to_state=TaskState.WORKING, message="hm")
    assert Task.agent.is_cached(working)  # the lock read it: no query when a dispatch asks
    assert working.agent.pk == agent.pk
    stored = Task.objects.get(pk=task.pk)
    assert stored.status_message == working.status_message
    assert stored.status_message["parts"] == [{"text": "hm"}]
    assert stored.updated_at == working.updated_at
    cleared = services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
    assert Task.objects.get(pk=task.pk).status_message is None is cleared.status_message
    done = services.task_reply_with_message(task_id=task.id, message="the answer")
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.answered_with_message, stored.last_seq) == (
        TaskState.COMPLETED,
        True,
        done.last_seq,
    )
    assert stored.status_timestamp == done.status_timestamp
    events = TaskEvent.objects.filter(task=task).order_by("seq")
    assert [e.seq for e in events] == [1, 2, 3, 4]
    update = events.last().payload["statusUpdate"]
    assert (update["taskId"], update["contextId"]) == (str(task.pk), task.context_id)
    assert update["status"]["state"] == "TASK_STATE_COMPLETED"
    assert update["status"]["message"]["parts"] == [{"text": "the answer"}]


def test_an_artifact_with_an_existing_id_replaces_it_in_place(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    first = {"artifactId": "r", "name": "one", "parts": [{"text": "a"}], "metadata": {"k": 1}}
    services.task_add_artifact(task_id=task.id, artifact=first, last_chunk=True)
    created = task.artifacts.get()
    second = {
        "artifactId": "r",
        "name": "two",
        "description": "again",
        "parts": [{"text": "b"}],
        "extensions": ["https://example.org/ext"],
    }
    services.task_add_artifact(task_id=task.id, artifact=second)
    art = task.artifacts.get()
    assert art.pk == created.pk
    assert art.created_at == created.created_at
    assert art.updated_at > created.updated_at
    assert (art.name, art.description, art.parts, art.metadata, art.extensions) == (
        "two",
        "again",
        [{"text": "b"}],
        {},
        ["https://example.org/ext"],
    )
    assert (art.complete, art.chunks) == (False, 1)
    services.task_add_artifact(
        task_id=task.id, artifact={"artifactId": "r", "parts": [{"text": "c"}]}, append=True
    )
    assert task.artifacts.get().parts == [{"text": "b"}, {"text": "c"}]


def test_a_rolled_back_event_leaves_the_task_as_it_was(agent, transactional_db):
    """The event, the task row, the artifact and the NOTIFY go with the transaction."""
    import psycopg

    from tests.processes import test_database_url

    task = task_create(agent=agent, owner="a", message=user_message())

    def write_then_fail() -> None:
        with transaction.atomic():
            services.task_add_artifact(
                task_id=task.id, artifact={"artifactId": "a", "parts": [{"text": "x"}]}
            )
            services.task_transition(task_id=task.id, to_state=TaskState.COMPLETED)
            raise RuntimeError("the caller fails after the writes")

    with psycopg.connect(test_database_url(), autocommit=True) as listener:
        listener.execute("LISTEN a2a_task_events")
        with pytest.raises(RuntimeError):
            write_then_fail()
        notes = list(listener.notifies(timeout=0.5))
    assert notes == []
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.last_seq) == (TaskState.SUBMITTED, 1)
    assert TaskEvent.objects.filter(task=task).count() == 1
    assert not task.artifacts.exists()


def test_snapshot_reads_scope_by_owner_and_keep_history_order(agent):
    task = task_create(agent=agent, owner="a", message=user_message("m1"))
    services.task_transition(task_id=task.id, to_state=TaskState.INPUT_REQUIRED, message="more?")
    services.task_append_message(task_id=task.id, message=user_message("m2"))
    for art in ("x", "y"):
        services.task_add_artifact(
            task_id=task.id, artifact={"artifactId": art, "parts": [{"text": art}]}
        )
    found = selectors.task_for_owner(agent_id=agent.pk, owner="a", task_id=str(task.pk))
    assert (found.pk, found.last_seq, found.state) == (task.pk, 5, TaskState.INPUT_REQUIRED)
    assert selectors.task_for_owner(agent_id=agent.pk, owner="b", task_id=task.pk) is None
    assert selectors.task_for_owner(agent_id=agent.pk + 1, owner="a", task_id=task.pk) is None

    def texts(history):
        return [m.parts[0]["text"] for m in history]

    assert texts(selectors.task_history(found, None)) == ["m1", "m2"]
    assert texts(selectors.task_history(found, 1)) == ["m2"]  # the newest, in order
    assert selectors.task_history(found, 0) == []
    assert [m.task.context_id for m in selectors.task_history(found, None)] == [task.context_id] * 2
    assert [a.artifact_id for a in selectors.task_artifacts(found)] == ["x", "y"]


def test_task_send_claims_a_receipt_once_and_replays_retries(agent):
    """Idempotent sends: the first claims the receipt with the write; a retry writes nothing
    and answers the same task; the id reused with another body is refused."""
    first_msg = user_message("hi")
    sent = services.task_send(agent=agent, owner="a", message=first_msg, request_hash="h1")
    assert (sent.created, sent.replayed, sent.task.last_seq) == (True, False, 1)
    assert sent.first_message.parts == [{"text": "hi"}]
    stored = Task.objects.get()
    assert (stored.pk, stored.last_seq, stored.messages.count()) == (sent.task.pk, 1, 1)
    assert stored.dispatches.get().enqueues == 1
    assert TaskEvent.objects.get(task=stored).payload["statusUpdate"]["taskId"] == str(stored.pk)

    again = services.task_send(agent=agent, owner="a", message=first_msg, request_hash="h1")
    assert (again.task.pk, again.created, again.replayed) == (sent.task.pk, False, True)
    with pytest.raises(InvalidPayload) as exc:
        services.task_send(agent=agent, owner="a", message=first_msg, request_hash="other")
    assert exc.value.field == "message.messageId"
    other_owner = services.task_send(agent=agent, owner="b", message=first_msg, request_hash="h1")
    assert other_owner.created  # receipts are per caller
    assert Task.objects.count() == 2
    assert MessageReceipt.objects.count() == 2

    services.task_transition(task_id=sent.task.pk, to_state=TaskState.INPUT_REQUIRED)
    follow = {**user_message("more"), "taskId": str(sent.task.pk)}
    went_on = services.task_send(agent=agent, owner="a", message=follow, request_hash="h2")
    assert (went_on.task.pk, went_on.created, went_on.replayed) == (sent.task.pk, False, False)
    retried = services.task_send(agent=agent, owner="a", message=follow, request_hash="h2")
    assert retried.replayed
    assert Task.objects.get(pk=sent.task.pk).messages.count() == 2


def test_task_send_new_writes_many_sends_at_once_each_with_its_own_outcome(agent):
    """Sends written together: each created, replayed or refused as alone; a refused one
    writes nothing and costs the others nothing; all of them in one store call."""
    first = services.task_send(
        agent=agent, owner="a", message=user_message("x", messageId="used"), request_hash="h"
    )
    empty = wire.parse_message(user_message("no parts"))
    del empty.parts[:]
    new = services.NewSend
    outcomes = services.task_send_new(
        sends=[
            new(agent, "a", user_message("one"), request_hash="h1"),
            new(agent, "a", empty, request_hash="h2"),
            new(agent, "a", user_message("x", messageId="used"), request_hash="h"),
            new(agent, "a", user_message("y", messageId="used"), request_hash="h3"),
            new(agent, "b", user_message("anon"), metadata={"k": 1}),
        ]
    )
    one, no_parts, replay, reused, anon = outcomes
    assert (one.created, one.replayed, anon.created) == (True, False, True)
    assert (replay.task.pk, replay.created, replay.replayed) == (first.task.pk, False, True)
    assert isinstance(no_parts, InvalidPayload)
    assert no_parts.field == "message.parts"
    assert isinstance(reused, InvalidPayload)
    assert reused.field == "message.messageId"
    assert {t.pk for t in Task.objects.all()} == {first.task.pk, one.task.pk, anon.task.pk}
    assert Task.objects.get(pk=anon.task.pk).metadata == {"k": 1}
    assert [m.parts for m in Task.objects.get(pk=one.task.pk).messages.all()] == [[{"text": "one"}]]
    assert MessageReceipt.objects.count() == 2  # first's, and one's
    assert {d.task_id: d.enqueues for d in ExecutorDispatch.objects.all()} == {
        first.task.pk: 1,
        one.task.pk: 1,
        anon.task.pk: 1,
    }
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        services.task_send_new(sends=[new(agent, "a", user_message("inside"))])
    assert Task.objects.count() == 3


def test_task_send_and_task_cancel_refuse_a_surrounding_transaction(agent):
    """Outermost services (durable): folded into a caller's transaction, their NOTIFY and
    jobs would silently move to the caller's commit."""
    task = task_create(agent=agent, owner="a", message=user_message())
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        services.task_send(agent=agent, owner="a", message=user_message())
    with pytest.raises(RuntimeError, match="durable"), transaction.atomic():
        services.task_cancel(task_id=task.id)
    assert Task.objects.count() == 1
    assert Task.objects.get().state == TaskState.SUBMITTED


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"message_id": ""}, "message.messageId"),
        ({"context_id": "c" * 256}, "message.contextId"),
        ({"message_id": "m" * 256}, "message.messageId"),
    ],
)
def test_a_parsed_message_is_checked_against_the_wire_rules_and_nothing_is_written(
    agent, change, field
):
    """A caller may hand task_send a message it parsed itself (a proto): it is checked by the
    rules a client's JSON is (wire.check_message), not trusted."""
    message = wire.parse_message(user_message("hi"))
    for name, value in change.items():
        setattr(message, name, value)
    with pytest.raises(InvalidPayload) as exc:
        services.task_send(agent=agent, owner="a", message=message)
    assert exc.value.field == field
    assert not Task.objects.exists()


def test_a_parsed_message_without_parts_is_refused(agent):
    message = wire.parse_message(user_message("hi"))
    del message.parts[:]
    with pytest.raises(InvalidPayload) as exc:
        services.task_send(agent=agent, owner="a", message=message)
    assert exc.value.field == "message.parts"
    assert not Task.objects.exists()
