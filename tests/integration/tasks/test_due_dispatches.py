"""The quick executors' dispatches: rung for on the doorbell, many run by one job.

A new echo dispatch rings the doorbell (a2a_platform/lib/doorbell.py) instead of publishing a
job of its own; one tasks.run_due_dispatches job claims the due ones oldest first
(dispatch_claim_due, one statement on PostgreSQL, the ORM twin on SQLite) and runs them,
watching the bell, so that dispatches committed meanwhile ring for it instead of publishing a job.
The broker is the test's real Redis: the queue is read to count what was published.
"""

import base64
import contextlib
import json
import re
import threading
import time
from datetime import timedelta

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from a2a_platform.lib import doorbell
from tasks import services, task_store
from tasks.dispatch import DUE_HELPER_BELL, dispatch_claim_due
from tasks.executors import runner
from tasks.executors.runner import run_due
from tasks.job_names import RUN_DUE_DISPATCHES_JOB, RUN_EXECUTOR_JOB
from tasks.models import DispatchState, ExecutorDispatch, Task, TaskEvent
from tasks.states import TaskState
from tasks.task_store.claims import _CLAIM_NEXT, _claim_dispatch_sql
from tasks.task_store.postgres import _DISPATCH_STATES, _TERMINAL
from tests import processes
from tests.factories import task_create, user_message
from tests.statements import statements, task_locks
from webhooks.models import Delivery, PushConfig

pytestmark = pytest.mark.django_db(transaction=True)

S = TaskState


BELL = doorbell.key(RUN_DUE_DISPATCHES_JOB)
HELPER_BELL = doorbell.key(DUE_HELPER_BELL)


@pytest.fixture
def broker():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete("agents", BELL, HELPER_BELL)
    yield client
    client.delete("agents", BELL, HELPER_BELL)


@pytest.fixture(params=["postgres", "orm"])
def store(request, settings):
    settings.A2A_STORE = request.param
    expected = {"postgres": task_store.PgTaskStore, "orm": task_store.OrmTaskStore}
    assert type(task_store.get_task_store()) is expected[request.param]
    return request.param


def published(broker) -> list[str]:
    """The job names waiting on the agents queue, oldest first."""
    return [json.loads(m)["headers"]["task"] for m in reversed(broker.lrange("agents", 0, -1))]


def published_kwargs(broker) -> list[dict]:
    """The keyword arguments of the jobs waiting on the agents queue, oldest first."""
    bodies = [json.loads(m)["body"] for m in reversed(broker.lrange("agents", 0, -1))]
    return [json.loads(base64.b64decode(body))[1] for body in bodies]


def send(agent, text: str = "hi") -> Task:
    return task_create(agent=agent, owner="o", message=user_message(text))


def test_new_echo_tasks_ring_once_for_one_job(agent, broker):
    tasks = [send(agent, f"m{i}") for i in range(5)]
    assert published(broker) == [RUN_DUE_DISPATCHES_JOB]
    assert broker.get(BELL) == doorbell.JOB_TOKEN.encode()  # it names that job
    # The job's drain watches the bell, then releases it: the next new task rings for another.
    doorbell.watch(RUN_DUE_DISPATCHES_JOB, "drain")
    doorbell.release(RUN_DUE_DISPATCHES_JOB, "drain")
    send(agent, "later")
    assert published(broker) == [RUN_DUE_DISPATCHES_JOB, RUN_DUE_DISPATCHES_JOB]
    assert all(t.dispatches.get().enqueues == 1 for t in tasks)


def test_other_executors_publish_their_own_job(scripted_agent, broker):
    task = send(scripted_agent)
    assert published(broker) == [RUN_EXECUTOR_JOB]
    assert task.dispatches.get().state == DispatchState.PENDING


def test_one_job_runs_every_due_dispatch(store, agent, scripted_agent, broker):
    echo = [send(agent, f"m{i}") for i in range(3)]
    scripted = send(scripted_agent)
    assert run_due(worker="w1") == 3
    for task in echo:
        task.refresh_from_db()
        assert task.task_state == S.COMPLETED
        assert task.dispatches.get().state == DispatchState.DONE
    # Not a quick executor's: left to its own job.
    assert scripted.dispatches.get().state == DispatchState.PENDING
    assert run_due(worker="w1") == 0


def test_a_job_past_its_limit_rings_for_the_rest(agent, broker):
    tasks = [send(agent, f"m{i}") for i in range(3)]
    broker.delete("agents")
    assert run_due(worker="w1", limit=2) == 2
    # A full batch meant a backlog: a job waits for the rest.
    assert published(broker) == [RUN_DUE_DISPATCHES_JOB]
    states = sorted(Task.objects.get(pk=t.pk).task_state.short for t in tasks)
    assert states == ["completed", "completed", "submitted"]
    assert run_due(worker="w2") == 1


def test_a_helper_stopped_with_work_left_rings_for_a_drain(agent, broker):
    for i in range(3):
        send(agent, f"m{i}")
    broker.delete("agents", BELL)
    assert run_due(worker="w1", helper=True, limit=2) == 2
    # Its last batch was full: a drain job (not a helper) waits for the rest.
    assert published(broker) == [RUN_DUE_DISPATCHES_JOB]
    assert published_kwargs(broker) == [{}]
    assert run_due(worker="w2") == 1


@contextlib.contextmanager
def lingering_drain(broker, **kwargs):
    """A drain (`run_due(worker="w1", **kwargs)`) in a thread; yields (the token it watches
    the bell with, the list its count is appended to once it returns), and joins it at the end."""
    ran: list[int] = []

    def drain() -> None:
        try:
            ran.append(run_due(worker="w1", **kwargs))
        finally:
            connection.close()

    thread = threading.Thread(target=drain)
    thread.start()
    try:
        watching = processes.wait_until(
            lambda: (
                (token := broker.get(BELL)) not in (None, doorbell.JOB_TOKEN.encode()) and token
            ),
            message="the drain watches the bell",
        )
        yield watching, ran
    finally:
        thread.join(30)
    assert not thread.is_alive()


def wait_completed(task: Task) -> None:
    processes.wait_until(
        lambda: Task.objects.get(pk=task.pk).task_state == S.COMPLETED,
        message="the drain ran the task",
    )


def test_a_lingering_drain_runs_new_tasks_on_their_rings_without_a_job(agent, broker):
    """A drain job out of work lingers watching the bell: tasks sent meanwhile publish no
    job, ring for it, and it runs them while it still watches the bell (not in its claim after the
    release, at its deadline here: the linger is longer). Then the next task rings for a job
    again."""
    with lingering_drain(broker, linger=60, seconds=5) as (watching, ran):
        for task in [send(agent, f"m{i}") for i in range(3)]:
            wait_completed(task)
        assert broker.get(BELL) == watching  # run on their rings, the bell still watched
        assert published(broker) == []  # rings heard, no job
    assert ran == [3]
    assert broker.get(BELL) is None
    send(agent, "after")
    assert published(broker) == [RUN_DUE_DISPATCHES_JOB]


def test_a_drain_lingering_longer_than_the_bells_ttl_keeps_watching_it(agent, broker):
    """A linger (A2A_DISPATCH_DRAIN_LINGER_SECONDS) longer than the bell's TTL: the drain
    refreshes the bell while it waits, so a task sent after the TTL has passed still rings
    for it and publishes no job."""
    with lingering_drain(broker, linger=3 * doorbell.RING_SECONDS, seconds=60) as (watching, ran):
        time.sleep(doorbell.RING_SECONDS + 0.5)  # the bell set before this would have expired
        assert broker.get(BELL) == watching
        wait_completed(send(agent, "late"))
        assert published(broker) == []
    assert ran == [1]
    assert broker.get(BELL) is None


def test_a_drain_claims_once_more_after_releasing_the_bell(agent, broker, monkeypatch):
    """A task committed while a drain watched the bell published no job. If the drain misses
    its ring (here it does not linger; a subscriber reconnecting misses one too), the claim
    it makes after releasing the bell runs it."""
    real = runner.dispatch_claim_due
    late: list[Task] = []

    def claim_then_send(**kwargs):
        claims = real(**kwargs)
        if not late:
            late.append(send(agent, "late"))  # its ring finds the bell watched: heard only
        return claims

    monkeypatch.setattr(runner, "dispatch_claim_due", claim_then_send)
    assert run_due(worker="w1") == 1
    assert published(broker) == []
    assert Task.objects.get(pk=late[0].pk).task_state == S.COMPLETED
    assert broker.get(BELL) is None


def test_a_drain_stops_at_its_deadline_however_long_its_linger(agent, broker):
    started = time.monotonic()
    assert run_due(worker="w1", linger=60, seconds=0.2) == 0
    assert time.monotonic() - started < 30  # the deadline ended it, not the linger
    assert broker.get(BELL) is None


def test_claim_due_takes_the_oldest_and_skips_what_is_not_its(store, agent, scripted_agent):
    now = timezone.now()
    old, new, later = (send(agent, t).dispatches.get() for t in ("old", "new", "later"))
    ExecutorDispatch.objects.filter(pk=old.pk).update(not_before=now - timedelta(seconds=5))
    ExecutorDispatch.objects.filter(pk=new.pk).update(not_before=now - timedelta(seconds=1))
    ExecutorDispatch.objects.filter(pk=later.pk).update(not_before=now + timedelta(minutes=1))
    send(scripted_agent)
    (first,) = dispatch_claim_due(worker="w1")
    (second,) = dispatch_claim_due(worker="w1")
    assert (first.dispatch_id, second.dispatch_id) == (old.pk, new.pk)
    assert first.task_id == str(old.task_id)
    assert first.executor == "echo"
    assert first.lease_expires_at > timezone.now()
    # The echo executor's whole read comes with the claim: the latest user message's parts.
    assert (first.user_parts, second.user_parts) == ([{"text": "old"}], [{"text": "new"}])
    # And the task row as it was (what the executor's answer is built from, unlocked).
    stored = Task.objects.get(pk=old.task_id)
    assert [getattr(first.task, f.attname) for f in Task._meta.concrete_fields] == [
        getattr(stored, f.attname) for f in Task._meta.concrete_fields
    ]
    old.refresh_from_db()
    assert (old.state, old.claimed_by, old.claims) == (DispatchState.CLAIMED, "w1", 1)
    # Not yet due, and a scripted agent's: none left to claim.
    assert dispatch_claim_due(worker="w1") == []


def test_claim_due_claims_a_batch_oldest_first_in_one_go(store, agent):
    tasks = [send(agent, f"m{i}") for i in range(5)]
    now = timezone.now()
    for age, task in enumerate(reversed(tasks), start=1):  # tasks[0] the oldest
        task.dispatches.update(not_before=now - timedelta(seconds=age))
    Task.objects.filter(pk=tasks[1].pk).update(state=S.CANCELED.value)  # finished meanwhile
    claims = dispatch_claim_due(worker="w1", limit=3)
    # The three oldest, locked together: the finished task's dispatch closed on the way.
    assert [c.task_id for c in claims] == [str(tasks[0].pk), str(tasks[2].pk)]
    assert [c.user_parts for c in claims] == [[{"text": "m0"}], [{"text": "m2"}]]
    for claim in claims:
        dispatch = ExecutorDispatch.objects.get(pk=claim.dispatch_id)
        assert (dispatch.state, dispatch.claimed_by, dispatch.claims) == (
            DispatchState.CLAIMED,
            "w1",
            1,
        )
        assert dispatch.lease_expires_at == claim.lease_expires_at
    assert tasks[1].dispatches.get().state == DispatchState.DONE
    rest = dispatch_claim_due(worker="w2", limit=10)
    assert [c.task_id for c in rest] == [str(tasks[3].pk), str(tasks[4].pk)]


def test_a_backlog_is_claimed_in_batches_and_every_task_run_once(store, agent, broker, monkeypatch):
    tasks = [send(agent, f"m{i}") for i in range(25)]
    sizes: list[int] = []
    real = runner.dispatch_claim_due

    def counted(**kwargs):
        claims = real(**kwargs)
        sizes.append(len(claims))
        return claims

    monkeypatch.setattr(runner, "dispatch_claim_due", counted)
    broker.delete("agents")
    assert run_due(worker="w1") == 25
    # Batches of CLAIM_BATCH, then the rest.
    assert sizes == [10, 10, 5, 0]
    # The two full batches rang for one helper between them (it drains beside this one).
    assert published(broker) == [RUN_DUE_DISPATCHES_JOB]
    assert published_kwargs(broker) == [{"helper": True}]
    assert broker.get(HELPER_BELL) == doorbell.JOB_TOKEN.encode()
    # The helper gives its bell back as it starts, runs what is due, and lingers for nothing.
    broker.delete("agents")
    assert run_due(worker="w2", helper=True, linger=5) == 0
    assert broker.get(HELPER_BELL) is None
    assert published(broker) == []
    for task in tasks:
        dispatch = task.dispatches.get()
        assert (dispatch.state, dispatch.claims) == (DispatchState.DONE, 1)
        assert Task.objects.get(pk=task.pk).task_state == S.COMPLETED


def test_claim_due_leaves_a_long_stranded_dispatch_to_the_sweeper(store, agent, settings):
    dispatch = send(agent).dispatches.get()
    stranded = timezone.now() - timedelta(seconds=settings.A2A_DISPATCH_UNCLAIMED_SECONDS + 1)
    ExecutorDispatch.objects.filter(pk=dispatch.pk).update(not_before=stranded)
    assert dispatch_claim_due(worker="w1") == []
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.PENDING


def test_claim_due_closes_a_finished_tasks_dispatch_and_goes_on(store, agent):
    finished, waiting = send(agent, "a"), send(agent, "b")
    Task.objects.filter(pk=finished.pk).update(state=S.CANCELED.value)
    (claim,) = dispatch_claim_due(worker="w1")
    assert claim.task_id == str(waiting.pk)
    assert finished.dispatches.get().state == DispatchState.DONE


@pytest.fixture
def refusing_publisher():
    """Celery publishes to a port nobody listens on; the doorbell's Redis is still up."""
    from a2a_platform.celery import app

    def point_at(url):
        app.conf.broker_write_url = url
        app._pool = None
        app.amqp._producer_pool = None

    previous = app.conf.broker_write_url
    point_at("redis://127.0.0.1:1/0")
    yield
    point_at(previous)


def test_a_refused_publish_leaves_the_bell_clear_for_the_next_ring(
    agent, broker, refusing_publisher
):
    task = send(agent)
    assert broker.get(BELL) is None
    assert task.dispatches.get().state == DispatchState.PENDING  # the sweeper's, in time


def test_doorbell_rings_once_until_released_or_expired(broker):
    assert doorbell.ring("job") is True
    assert doorbell.ring("job") is False
    doorbell.release("job")
    assert doorbell.ring("job") is True
    assert 0 < broker.pttl("a2a:doorbell:job") <= doorbell.RING_SECONDS * 1000
    broker.delete("a2a:doorbell:job")


def test_a_ring_reaches_the_bells_watcher_and_only_the_watcher_releases_it(broker):
    rings: list[bytes] = []
    arrived = threading.Event()

    def heard(token: bytes) -> None:
        rings.append(token)
        arrived.set()

    assert doorbell.listen(heard)
    try:
        doorbell.watch("job", "drain-a")
        assert doorbell.ring("job") is False  # no job: the watching drain hears it instead
        assert arrived.wait(5)
        assert rings == [b"drain-a"]
        doorbell.release("job", "drain-b")  # not the drain watching it: still watched
        assert doorbell.watching("job", "drain-a")
        doorbell.release("job")  # nor is a job
        assert doorbell.watching("job", "drain-a")
        doorbell.release("job", "drain-a")
        assert broker.get("a2a:doorbell:job") is None
        assert doorbell.ring("job") is True
    finally:
        doorbell.unlisten(heard)
        broker.delete("a2a:doorbell:job")


def test_doorbell_without_redis_always_publishes(settings):
    # The embedded file-system broker, and a Redis that refuses: each ring publishes.
    settings.CELERY_BROKER_URL = "filesystem://"
    assert doorbell.ring("job") is True
    assert doorbell.ring("job") is True
    doorbell.release("job")
    assert doorbell.listen(print) is False  # nothing is heard either: a drain does not linger
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    assert doorbell.ring("job") is True
    assert doorbell.ring("job") is True
    doorbell.release("job")


def test_the_claim_reads_the_due_index_in_order_without_sorting_the_backlog(agent, broker):
    """The quick claim stops at the first due row it can lock: no Sort node in its plan, for
    the custom plan and for the generic one a prepared statement settles on. A sort (an id
    tie-break the index cannot give) read a batch of the backlog per claim, about 1 ms of
    PostgreSQL's time a claim under load (docs/decisions.md, "The task store")."""
    from django.db import connection, transaction

    for i in range(40):
        send(agent, f"m{i}")
    now = timezone.now()
    params = {
        "executors": ["echo"],
        "since": now - timedelta(seconds=30),
        "limit": 10,
        "worker": "w",
        "now": now,
        "lease": now + timedelta(seconds=30),
        "terminal": list(_TERMINAL),
        **_DISPATCH_STATES,
    }
    sql = _claim_dispatch_sql(_CLAIM_NEXT)
    for mode in ("force_custom_plan", "force_generic_plan"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL plan_cache_mode = {mode}")
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = json.dumps(cursor.fetchone()[0])
        assert '"Index Name": "dispatch_due"' in plan, mode
        assert '"Node Type": "Sort"' not in plan, mode
        assert '"Node Type": "Incremental Sort"' not in plan, mode


def test_a_quick_run_answers_from_its_claims_row_without_locking_the_task(store, agent):
    tasks = [send(agent, f"m{i}") for i in range(3)]
    with statements() as ran:
        assert run_due(worker="w1") == 3
    # The claim read each task's row; each answer was written only if its row had not moved.
    assert task_locks(ran) == 0
    for task in tasks:
        task.refresh_from_db()
        assert (task.task_state, task.last_seq) == (S.COMPLETED, 4)
        assert task.artifacts.get().parts == task.messages.get().parts  # the echo


def answer_transactions(tasks: list[Task]) -> list[list[str]]:
    """The tasks' answers grouped by the transaction that wrote them (their events' xmin),
    each group's tasks in the order their WORKING events were inserted."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text, task_id::text FROM tasks_taskevent"
            " WHERE task_id = ANY(%s) AND seq = 2 ORDER BY id",
            [[task.pk for task in tasks]],
        )
        groups: dict[str, list[str]] = {}
        for xid, task_id in cursor.fetchall():
            groups.setdefault(xid, []).append(task_id)
    return list(groups.values())


def test_a_backlogs_batches_are_answered_one_transaction_each(store, agent, broker):
    tasks = [send(agent, f"m{i}") for i in range(21)]
    with statements() as ran:
        assert run_due(worker="w1") == 21
    # An answer joins its batch's transaction without a savepoint of its own.
    assert not [sql for sql in ran if "SAVEPOINT" in sql]
    ids = [str(task.pk) for task in tasks]
    groups = answer_transactions(tasks)
    # Two batches of CLAIM_BATCH and the last one alone, each one commit.
    assert [len(group) for group in groups] == [10, 10, 1]
    assert groups[2] == ids[20:]
    for group, claimed in zip(groups[:2], (ids[:10], ids[10:20]), strict=True):
        # Each batch's tasks written in task id order (a rebind locks task rows so).
        assert group == sorted(claimed)
    for task in tasks:
        task.refresh_from_db()
        assert (task.task_state, task.last_seq) == (S.COMPLETED, 4)
        assert task.artifacts.get().parts == task.messages.get().parts
        assert task.dispatches.get().state == DispatchState.DONE


def test_a_batchs_answers_are_written_in_one_statement(agent, broker):
    assert isinstance(task_store.get_task_store(), task_store.PgTaskStore)
    tasks = [send(agent, f"m{i}") for i in range(5)]
    with statements() as ran:
        assert run_due(worker="w1") == 5
    # The five answers' task rows, events, artifacts and dispatch closes: one statement, and
    # no answer written on its own.
    assert len([sql for sql in ran if sql.startswith("WITH w AS")]) == 1
    assert not [sql for sql in ran if sql.startswith("WITH task AS (UPDATE")]
    assert len(answer_transactions(tasks)) == 1
    for task in tasks:
        task.refresh_from_db()
        assert (task.task_state, task.last_seq) == (S.COMPLETED, 4)
        assert list(task.events.order_by("seq").values_list("kind", flat=True)) == [
            "status",
            "status",
            "artifact",
            "status",
        ]
        assert task.artifacts.get().parts == task.messages.get().parts
        assert task.dispatches.get().state == DispatchState.DONE


def test_a_batchs_answers_lock_every_task_row_in_id_order_the_moved_ones_too(agent):
    """The answers' statement locks all the batch's task rows (in id order, a rebind's), so
    the answer of a task that moved meanwhile, written after it under its lock, waits for
    no lock out of order: the row is already held. Checked from another session."""
    tasks = sorted((send(agent, f"m{i}") for i in range(3)), key=lambda t: str(t.pk))
    seen = [Task.objects.get(pk=task.pk) for task in tasks]
    services.task_transition(task_id=tasks[0].pk, to_state=S.WORKING)  # moved since read
    for task in seen:
        task.state, task.last_seq = S.WORKING.value, 2
    writes = [
        (
            task,
            [TaskEvent(task=task, seq=2, kind="status", payload={}, created_at=timezone.now())],
            None,
        )
        for task in seen
    ]
    with transaction.atomic():
        written = task_store.PgTaskStore().append_events_together(writes)
        assert written == {task.pk for task in tasks[1:]}
        with psycopg.connect(processes.test_database_url(), autocommit=True) as other:
            for task in tasks:
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    other.execute(
                        "SELECT 1 FROM tasks_task WHERE id = %s FOR UPDATE NOWAIT", [task.pk]
                    )


def test_a_batched_runs_answer_is_buffered_until_the_batch_ends_or_its_next_read(agent):
    task = send(agent)
    (claim,) = dispatch_claim_due(worker="w1", limit=1)
    ctx = runner._context(claim, batched=True)
    with transaction.atomic():
        ctx.answer([{"text": "x"}], artifact_id="a")
        assert ctx.finished
        assert ctx.buffered_answer is not None
        assert Task.objects.get(pk=task.pk).task_state == S.SUBMITTED  # buffered: not written yet
        # Any read or verb of the run writes it first: the run sees its own answer.
        assert ctx.task().task_state == S.COMPLETED
        assert ctx.buffered_answer is None
    task.refresh_from_db()
    assert (task.task_state, task.last_seq) == (S.COMPLETED, 4)


def test_a_batchs_outbox_rows_are_written_in_one_statement_each_to_its_own_configs(
    store, agent, broker
):
    # Six tasks, two push configs on one, one on three others, none on two: one batch, one
    # outbox statement for all of it, and each config owed its own task's answer, in order.
    from tests.webhook_checks import open_task

    hook = {"url": "http://127.0.0.1:9/hook"}
    opened = [open_task(agent, f"m{i}", *[hook] * n) for i, n in enumerate([2, 1, 0, 1, 0, 1])]
    with statements() as ran:
        assert run_due(worker="w1") == 6
    assert len(answer_transactions([task for task, _ in opened])) == 1
    assert len([sql for sql in ran if re.search(r'INSERT INTO "?webhooks_delivery\b', sql)]) == 1
    for task, configs in opened:
        for config in configs:
            rows = Delivery.objects.filter(config=config).order_by("id")
            assert [(d.task_id, d.seq, d.kind) for d in rows] == [
                (task.pk, 1, "snapshot"),  # written when the config was registered
                (task.pk, 2, "status"),
                (task.pk, 3, "artifact"),
                (task.pk, 4, "status"),
            ]
            assert PushConfig.objects.get(pk=config.pk).head_due_at is not None
    assert Delivery.objects.count() == 4 * 5


def test_a_batch_rolled_back_leaves_no_outbox_rows_collected_and_each_lone_run_writes_its_own(
    store, agent
):
    # The batch's outbox rows wait for its end (hooks_together). When one run raises, the
    # batch rolls back with them unwritten; each claim then runs alone and its config is owed
    # its answer exactly once (nothing kept from the batch, nothing collected after it).
    from tests.webhook_checks import open_task

    hook = {"url": "http://127.0.0.1:9/hook"}
    opened = [open_task(agent, f"m{i}", hook) for i in range(3)]
    claims = dispatch_claim_due(worker="w1", limit=3)
    canceled, _ = opened[1]
    services.task_cancel(task_id=canceled.pk)

    runner._run_together(claims, "w1")

    for task, (config,) in (opened[0], opened[2]):
        rows = Delivery.objects.filter(config=config).order_by("id")
        assert {d.task_id for d in rows} == {task.pk}
        assert [(d.seq, d.kind) for d in rows] == [
            (1, "snapshot"),
            (2, "status"),
            (3, "artifact"),
            (4, "status"),
        ]
    (config,) = opened[1][1]
    assert [(d.seq, d.kind) for d in Delivery.objects.filter(config=config).order_by("id")] == [
        (1, "snapshot"),
        (2, "status"),  # the cancel
    ]
    # A later write's hooks run at once: nothing is left collecting them on this thread.
    later, (config,) = open_task(agent, "later", hook)
    services.task_transition(task_id=later.pk, to_state=S.WORKING)
    assert [d.seq for d in Delivery.objects.filter(config=config).order_by("id")] == [1, 2]


def test_a_run_that_fails_rolls_its_batch_back_and_each_runs_on_its_own(store, agent):
    tasks = [send(agent, f"m{i}") for i in range(3)]
    claims = dispatch_claim_due(worker="w1", limit=3)
    # Canceled after its claim: its answer, built from the claim's row, misses and is
    # decided under the lock, where the task is terminal (TaskTerminal).
    services.task_cancel(task_id=tasks[1].pk)

    runner._run_together(claims, "w1")

    answered = [tasks[0], tasks[2]]
    # Nothing of the batch stayed: each was answered in a transaction of its own.
    assert sorted(answer_transactions(answered)) == sorted([[str(t.pk)] for t in answered])
    for task in answered:
        task.refresh_from_db()
        assert (task.task_state, task.last_seq) == (S.COMPLETED, 4)
        assert list(task.events.order_by("seq").values_list("seq", flat=True)) == [1, 2, 3, 4]
        assert task.dispatches.get().state == DispatchState.DONE
    canceled = Task.objects.get(pk=tasks[1].pk)
    assert (canceled.task_state, canceled.last_seq) == (S.CANCELED, 2)
    assert not canceled.artifacts.exists()
    assert canceled.dispatches.get().state == DispatchState.DONE


def test_each_step_of_a_task_is_one_line_on_the_lifecycle_logger(agent, broker, caplog):
    """Created, claimed, answered: one line each on `tasks.lifecycle` (A2A_TASK_LOG_LEVEL,
    quiet by default), none of them on the modules' own loggers."""
    caplog.set_level("INFO", logger="tasks")
    caplog.set_level("INFO", logger="tasks.lifecycle")
    task = send(agent)
    assert run_due(worker="w") == 1
    mine = [r for r in caplog.records if getattr(r, "task_id", None) == str(task.id)]
    lines = [(r.name, r.getMessage()) for r in mine]
    assert lines == [
        ("tasks.lifecycle", "task created"),
        ("tasks.lifecycle", "dispatch claimed"),
        ("tasks.lifecycle", "task answered"),
    ]
