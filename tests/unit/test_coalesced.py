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


def test_a_caller_that_stops_waiting_leaves_the_others_their_answers():
    started = threading.Event()
    release = threading.Event()
    calls: list[list[int]] = []

    def slow(keys: list[int]) -> list[int]:
        calls.append(list(keys))
        started.set()
        release.wait(5)
        return [k * 10 for k in keys]

    coalesced = Coalesced(slow)
    errors: list[dict] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
        gone = asyncio.ensure_future(coalesced(1))
        stays = asyncio.ensure_future(coalesced(2))
        await asyncio.to_thread(started.wait, 5)
        gone.cancel()
        release.set()
        answer = await stays
        await asyncio.sleep(0.05)  # the read's task settles both futures
        return gone.cancelled(), answer

    assert run(main()) == (True, 20)
    assert calls == [[1, 2]]
    assert errors == []
