"""Coalesced (a2a_platform/lib/orm.py): the reads asked for in one turn of the event loop run
as one call on an ORM thread; each caller gets its own answer, and one failing key fails
alone."""

from __future__ import annotations

import asyncio
import threading

import pytest

from a2a_platform.lib.orm import Coalesced


class Recorder:
    """A read_many that answers key * 10 and records each call's keys (and its thread)."""

    def __init__(self, fail_on: frozenset[int] = frozenset()) -> None:
        self.calls: list[list[int]] = []
        self.threads: set[str] = set()
        self.fail_on = fail_on

    def __call__(self, keys: list[int]) -> list[int]:
        self.calls.append(list(keys))
        self.threads.add(threading.current_thread().name)
        bad = self.fail_on.intersection(keys)
        if bad:
            raise LookupError(f"no {sorted(bad)}")
        return [key * 10 for key in keys]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_calls_made_in_one_turn_are_one_read_each_answered_in_order():
    read = Recorder()
    coalesced = Coalesced(read)

    async def main():
        return await asyncio.gather(*(coalesced(k) for k in [3, 1, 2, 1]))

    assert run(main()) == [30, 10, 20, 10]
    assert read.calls == [[3, 1, 2, 1]]
    # On the ORM threads, not the event loop's.
    assert read.threads
    assert all(name.startswith("orm") for name in read.threads)


def test_calls_in_separate_turns_are_separate_reads():
    read = Recorder()
    coalesced = Coalesced(read)

    async def main():
        return [await coalesced(1), await coalesced(2)]

    assert run(main()) == [10, 20]
    assert read.calls == [[1], [2]]


def test_more_than_most_are_split_into_reads_of_at_most_most():
    read = Recorder()
    coalesced = Coalesced(read, most=3)

    async def main():
        return await asyncio.gather(*(coalesced(k) for k in range(8)))

    assert run(main()) == [k * 10 for k in range(8)]
    assert sorted(read.calls) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_a_key_whose_read_fails_fails_alone():
    read = Recorder(fail_on=frozenset({2}))
    coalesced = Coalesced(read)

    async def main():
        return await asyncio.gather(*(coalesced(k) for k in [1, 2, 3]), return_exceptions=True)

    one, two, three = run(main())
    assert (one, three) == (10, 30)
    assert isinstance(two, LookupError)
    assert str(two) == "no [2]"
    # The batch, then each key on its own.
    assert read.calls[0] == [1, 2, 3]
    assert sorted(read.calls[1:]) == [[1], [2], [3]]


def test_an_exception_answered_for_a_key_is_raised_to_its_caller_alone_without_a_retry():
    # A call that writes answers a refused key with its error (services.task_send_new): the
    # others' answers stand, and nothing is called again (a retry would write them twice).
    calls: list[list[int]] = []

    def write_many(keys: list[int]) -> list[object]:
        calls.append(list(keys))
        return [ValueError(f"refused {k}") if k % 2 else k * 10 for k in keys]

    coalesced = Coalesced(write_many)

    async def main():
        return await asyncio.gather(*(coalesced(k) for k in [2, 3, 4]), return_exceptions=True)

    two, three, four = run(main())
    assert (two, four) == (20, 40)
    assert isinstance(three, ValueError)
    assert str(three) == "refused 3"
    assert calls == [[2, 3, 4]]


def test_a_lone_failing_read_raises_to_its_caller():
    coalesced = Coalesced(Recorder(fail_on=frozenset({5})))
    with pytest.raises(LookupError, match=r"no \[5\]"):
        run(coalesced(5))


def test_a_read_answering_the_wrong_number_of_results_raises_instead_of_hanging():
    coalesced = Coalesced(lambda keys: [0])  # one answer whatever was asked

    async def main():
        return await asyncio.gather(*(coalesced(k) for k in [1, 2]), return_exceptions=True)

    # Two keys: the batch fails; alone, each gets its one answer.
    assert run(main()) == [0, 0]

    never = Coalesced(lambda keys: [])
    with pytest.raises(ValueError, match="shorter"):
        run(never(1))


class Held:
    """A read_many that answers key * 10 once released, recording each call's keys."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls: list[list[int]] = []

    def __call__(self, keys: list[int]) -> list[int]:
        self.calls.append(list(keys))
        self.started.set()
        self.release.wait(5)
        return [k * 10 for k in keys]


def test_a_caller_that_stops_waiting_leaves_the_others_their_answers():
    slow = Held()
    coalesced = Coalesced(slow)
    errors: list[dict] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        gone = asyncio.ensure_future(coalesced(1))
        stays = asyncio.ensure_future(coalesced(2))
        await asyncio.to_thread(slow.started.wait, 5)
        gone.cancel()
        slow.release.set()
        answer = await stays
        await asyncio.sleep(0.05)  # the read's task settles both futures
        return gone.cancelled(), answer

    assert run(main()) == (True, 20)
    assert slow.calls == [[1, 2]]
    assert errors == []


def test_keys_asked_for_while_a_call_runs_wait_for_it_and_then_go_together():
    slow = Held()
    coalesced = Coalesced(slow, in_flight=1)

    async def main():
        first = asyncio.ensure_future(coalesced(1))
        await asyncio.to_thread(slow.started.wait, 5)
        later = []
        for key in (2, 3, 4):  # each in a turn of its own, while the first call runs
            later.append(asyncio.ensure_future(coalesced(key)))
            await asyncio.sleep(0)
        gone = asyncio.ensure_future(coalesced(5))
        await asyncio.sleep(0)
        gone.cancel()  # stopped waiting before its call began: left out of it
        await asyncio.sleep(0.05)
        assert slow.calls == [[1]]  # nothing else started while the first ran
        slow.release.set()
        return await first, await asyncio.gather(*later)

    assert run(main()) == (10, [20, 30, 40])
    assert slow.calls == [[1], [2, 3, 4]]


def test_in_flight_bounds_the_calls_running_at_once():
    release = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, most seen
    calls: list[list[int]] = []

    def slow(keys: list[int]) -> list[int]:
        with lock:
            calls.append(list(keys))
            running[0] += 1
            running[1] = max(running)
        release.wait(5)
        with lock:
            running[0] -= 1
        return [k * 10 for k in keys]

    coalesced = Coalesced(slow, most=1, in_flight=2)

    async def main():
        pending = asyncio.gather(*(coalesced(k) for k in range(5)))
        await asyncio.sleep(0.1)
        started = len(calls)
        release.set()
        return started, await pending

    assert run(main()) == (2, [0, 10, 20, 30, 40])
    assert running[1] == 2
    assert sorted(calls) == [[0], [1], [2], [3], [4]]


def test_without_in_flight_a_later_turn_does_not_wait_for_a_slow_call():
    # The reads' way: a long read (a task with a long history) holds no other reader.
    slow = Held()
    coalesced = Coalesced(slow)

    async def main():
        first = asyncio.ensure_future(coalesced(1))
        await asyncio.to_thread(slow.started.wait, 5)
        second = asyncio.ensure_future(coalesced(2))
        for _ in range(100):  # its own call starts while the first is held
            if len(slow.calls) == 2:
                break
            await asyncio.sleep(0.01)
        calls = list(slow.calls)
        slow.release.set()
        return calls, await first, await second

    assert run(main()) == ([[1], [2]], 10, 20)
