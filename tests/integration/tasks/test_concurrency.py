"""Lifecycle services under real concurrency on PostgreSQL: many threads, one task.

Each thread runs its service call in its own connection (from Django's pool) and gives it back;
the row lock in `lock_task` must serialize them so that `seq` stays gap-free, nothing is lost,
and where only one transition is legal exactly one caller wins.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import connection

from tasks import services
from tasks.models import ACTIVE_DISPATCH_STATES, Artifact, EventKind, Task, TaskEvent
from tasks.state_machine import IllegalTransition
from tasks.states import TERMINAL_STATES, TaskState
from tests.factories import task_create, user_message
from tests.locks import held_open, in_thread, wait_for_a_lock_waiter

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 50


def run_concurrently(calls: list[Callable[[], object]]) -> list[object]:
    """Run each call in its own thread, released together; results or raised exceptions."""
    results: list[object] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a service call hung"
    return results


def event_seqs(task_id) -> list[int]:
    return list(
        TaskEvent.objects.filter(task_id=task_id).order_by("seq").values_list("seq", flat=True)
    )


def test_concurrent_transitions_and_artifacts_keep_seq_gap_free(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
    services.task_add_artifact(
        task_id=task.id, artifact={"artifactId": "shared", "parts": [{"text": "init"}]}
    )
    before = Task.objects.get(pk=task.id).last_seq
    assert before == 3

    def progress(i: int) -> Callable[[], object]:
        return lambda: services.task_transition(
            task_id=task.id, to_state=TaskState.WORKING, message=f"progress {i}"
        )

    def new_artifact(i: int) -> Callable[[], object]:
        return lambda: services.task_add_artifact(
            task_id=task.id, artifact={"artifactId": f"own-{i}", "parts": [{"text": f"own {i}"}]}
        )

    def chunk(i: int) -> Callable[[], object]:
        return lambda: services.task_add_artifact(
            task_id=task.id,
            artifact={"artifactId": "shared", "parts": [{"text": f"chunk {i}"}]},
            append=True,
        )

    kinds = [progress, new_artifact, chunk]
    calls = [kinds[i % 3](i) for i in range(THREADS)]
    results = run_concurrently(calls)

    errors = [r for r in results if isinstance(r, Exception)]
    assert errors == []
    successes = len(results)
    task.refresh_from_db()
    n = before + successes
    assert task.last_seq == n
    assert event_seqs(task.id) == list(range(1, n + 1))

    # Each returned task saw its own event: the seqs handed out are exactly before+1..n.
    assert sorted(r.last_seq for r in results) == list(range(before + 1, n + 1))

    progress_ids = [i for i in range(THREADS) if i % 3 == 0]
    own_ids = [i for i in range(THREADS) if i % 3 == 1]
    chunk_ids = [i for i in range(THREADS) if i % 3 == 2]

    status_events = TaskEvent.objects.filter(
        task=task, kind=EventKind.STATUS, seq__gt=before
    ).order_by("seq")
    texts = [
        e.payload["statusUpdate"]["status"]["message"]["parts"][0]["text"] for e in status_events
    ]
    assert sorted(texts) == sorted(f"progress {i}" for i in progress_ids)
    stamps = [
        e.payload["statusUpdate"]["status"]["timestamp"]
        for e in TaskEvent.objects.filter(task=task, kind=EventKind.STATUS).order_by("seq")
    ]
    assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False)), stamps

    artifacts = {a.artifact_id: a for a in Artifact.objects.filter(task=task)}
    assert set(artifacts) == {"shared"} | {f"own-{i}" for i in own_ids}
    shared = artifacts["shared"]
    shared_texts = [p["text"] for p in shared.parts]
    assert shared_texts[0] == "init"
    assert sorted(shared_texts[1:]) == sorted(f"chunk {i}" for i in chunk_ids)
    assert shared.chunks == 1 + len(chunk_ids)
    assert TaskEvent.objects.filter(task=task, kind=EventKind.ARTIFACT).count() == (
        1 + len(own_ids) + len(chunk_ids)
    )
    # The chunk events appear in the order the parts were appended (the lock serialized them).
    chunk_events = TaskEvent.objects.filter(
        task=task, kind=EventKind.ARTIFACT, payload__artifactUpdate__append=True
    ).order_by("seq")
    assert [e.payload["artifactUpdate"]["artifact"]["parts"][0]["text"] for e in chunk_events] == (
        shared_texts[1:]
    )


def test_concurrent_terminal_transitions_have_exactly_one_winner(agent):
    task = task_create(agent=agent, owner="a", message=user_message())
    services.task_transition(task_id=task.id, to_state=TaskState.WORKING)
    targets = [TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED]

    def finish(state: TaskState) -> Callable[[], object]:
        return lambda: services.task_transition(task_id=task.id, to_state=state)

    results = run_concurrently([finish(targets[i % 3]) for i in range(THREADS)])

    winners = [r for r in results if isinstance(r, Task)]
    losers = [r for r in results if isinstance(r, IllegalTransition)]
    others = [r for r in results if not isinstance(r, Task | IllegalTransition)]
    assert others == []
    assert len(winners) == 1
    assert len(losers) == THREADS - 1
    assert all(exc.terminal for exc in losers)
    winner_state = winners[0].task_state
    assert all(exc.from_state == winner_state for exc in losers)

    task.refresh_from_db()
    assert task.task_state == winner_state
    assert task.last_seq == 3
    assert event_seqs(task.id) == [1, 2, 3]
    terminal_events = [
        e
        for e in TaskEvent.objects.filter(task=task, kind=EventKind.STATUS)
        if e.payload["statusUpdate"]["status"]["state"] in TERMINAL_STATES
    ]
    assert len(terminal_events) == 1
    assert terminal_events[0].payload["statusUpdate"]["status"]["state"] == winner_state
    assert not task.dispatches.filter(state__in=ACTIVE_DISPATCH_STATES).exists()


def test_no_event_lands_after_a_concurrent_terminal_transition(agent):
    """Artifacts racing a completion either land before it or are refused; none after it."""
    from tasks.errors import TaskTerminal

    task = task_create(agent=agent, owner="a", message=user_message())
    services.task_transition(task_id=task.id, to_state=TaskState.WORKING)

    def add(i: int) -> Callable[[], object]:
        return lambda: services.task_add_artifact(
            task_id=task.id, artifact={"artifactId": f"a{i}", "parts": [{"text": str(i)}]}
        )

    calls = [add(i) for i in range(THREADS - 1)]
    calls.insert(
        THREADS // 2,
        lambda: services.task_transition(task_id=task.id, to_state=TaskState.COMPLETED),
    )
    results = run_concurrently(calls)

    assert not [r for r in results if isinstance(r, Exception) and not isinstance(r, TaskTerminal)]
    added = sum(1 for r in results if isinstance(r, Task)) - 1  # minus the completion
    refused = sum(1 for r in results if isinstance(r, TaskTerminal))
    assert added + refused == THREADS - 1
    task.refresh_from_db()
    assert task.task_state == TaskState.COMPLETED
    assert task.last_seq == 2 + added + 1
    assert event_seqs(task.id) == list(range(1, task.last_seq + 1))
    last = TaskEvent.objects.get(task=task, seq=task.last_seq)
    assert last.payload["statusUpdate"]["status"]["state"] == TaskState.COMPLETED
    assert Artifact.objects.filter(task=task).count() == added


def hold_task_lock(task_id):
    """Keep `task_id`'s row locked (as a lifecycle service does) until the block ends."""
    return held_open(lambda: services.lock_task(task_id))


def test_writes_to_other_tasks_of_the_same_agent_do_not_wait(agent):
    """Locking a task must not lock its agent: an agent's tasks are independent."""
    busy = task_create(agent=agent, owner="a", message=user_message())
    other = task_create(agent=agent, owner="a", message=user_message())
    with hold_task_lock(busy.id):
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        try:
            services.task_transition(task_id=other.id, to_state=TaskState.WORKING)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
    assert Task.objects.get(pk=other.id).task_state == TaskState.WORKING


def test_dispatch_claim_is_not_skipped_while_its_task_is_being_written(agent):
    """A claim skips dispatches other claimers hold, not ones whose task row is busy.

    Skipping drops the executor job: the task then waits for the sweeper and loses a try.
    """
    from tasks.dispatch import dispatch_claim

    task = task_create(agent=agent, owner="a", message=user_message())
    dispatch = task.dispatches.get()
    with hold_task_lock(task.id):
        claim = dispatch_claim(dispatch_id=dispatch.pk, worker="w")
    assert claim is not None
    assert claim.dispatch_id == dispatch.pk


def test_concurrent_duplicate_sends_open_one_task_and_replay_it(agent):
    """The same messageId sent by many callers at once (a client's retries racing): the
    receipt's unique index makes every send but one wait for the first to commit, then
    write nothing and answer its task."""
    message = user_message("once")
    sends = [
        lambda: services.task_send(agent=agent, owner="a", message=message, request_hash="h")
        for _ in range(20)
    ]
    results = run_concurrently(sends)
    assert not [r for r in results if isinstance(r, Exception)]
    assert sorted((r.created, r.replayed) for r in results) == [(False, True)] * 19 + [
        (True, False)
    ]
    (task,) = Task.objects.all()
    assert {r.task.pk for r in results} == {task.pk}
    assert (task.messages.count(), task.dispatches.count(), task.events.count()) == (1, 1, 1)


@pytest.mark.parametrize("mover", ["cancel", "message"])
def test_an_answer_from_the_claims_row_racing_another_write_waits_for_it_then_sees_it(agent, mover):
    """The executor's answer built from the task row its claim read, while another write to
    the task is in flight: the answer's write queues behind that write's lock, finds the
    task moved once it commits, and is decided again under the lock: a cancel wins (nothing
    of the answer lands), a client's message comes before the answer."""
    from tasks.errors import TaskTerminal

    task = task_create(agent=agent, owner="a", message=user_message())
    seen = Task.objects.get(pk=task.pk)  # as the quick claim read it
    moves = {
        "cancel": lambda: services.task_transition(task_id=task.pk, to_state=TaskState.CANCELED),
        "message": lambda: services.task_append_message(
            task_id=task.pk, message=user_message("more")
        ),
    }
    echo = {"artifactId": "echo", "parts": [{"text": "hi"}]}
    with held_open(moves[mover]) as moved:
        answer = in_thread(lambda: services.task_answer(task_id=task.pk, artifact=echo, seen=seen))
        wait_for_a_lock_waiter()
    answered = answer()
    assert isinstance(moved[0], Task)
    task.refresh_from_db()
    kinds = list(task.events.order_by("seq").values_list("kind", flat=True))
    if mover == "cancel":
        assert isinstance(answered, TaskTerminal)
        assert (task.task_state, kinds) == (TaskState.CANCELED, ["status", "status"])
        assert not task.artifacts.exists()
    else:
        assert isinstance(answered, Task)
        assert task.task_state == TaskState.COMPLETED
        assert kinds == ["status", "message", "status", "artifact", "status"]
    assert event_seqs(task.id) == list(range(1, task.last_seq + 1))
