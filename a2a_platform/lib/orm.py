"""Short ORM calls from async code, on a small fixed set of threads.

Each of the `A2A_ORM_THREADS` threads keeps the one pooled connection it checked out, so a
call costs a thread hop and the queries, not a pool checkout; the number of database
connections a web process uses is bounded by the thread count however many requests wait on
the event hub (waiters hold no connection). A call that fails closes its thread's connection,
so the next call starts from a clean one.

`Coalesced` runs the calls of one read, or one write atomic on its own, that arrive in the same
turn of the event loop as one ORM call (GetTask: one statement for every request in the turn;
SendMessage's new tasks: one statement and one commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from django.conf import settings
from django.db import connections

T = TypeVar("T")
K = TypeVar("K")

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _get_executor() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(
                    max_workers=settings.A2A_ORM_THREADS,
                    thread_name_prefix="orm",
                    initializer=_no_wakeup_preemption,
                )
    return _executor


def _no_wakeup_preemption() -> None:
    """Linux's SCHED_BATCH for this ORM thread: woken, it does not preempt the running
    thread. The event loop's thread holds the GIL when it hands a call over; an ORM thread
    that preempted it could only wait for the GIL, two context switches per call on a busy
    core (docs/decisions.md, "Issue 19, tenth pass"). Same priority otherwise; a no-op
    where the policy does not exist."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _call(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except BaseException:
        # A failed query may leave the connection in an aborted transaction.
        connections.close_all()
        raise


async def run_orm(fn: Callable[[], T]) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_get_executor(), _call, fn)


@dataclasses.dataclass
class _Queue(Generic[K]):
    """A Coalesced's state in one event loop."""

    waiting: list[tuple[K, asyncio.Future]] = dataclasses.field(default_factory=list)
    flush_due: bool = False
    running: int = 0


class Coalesced(Generic[K, T]):
    """One read for many callers: `await coalesced(key)` returns `read_many([...])`'s result
    for `key`, where the list holds every key asked for in the same turn of the event loop
    (at most `most`; more make several calls). One ORM call, one thread hop and one
    statement serve them all, instead of one each (docs/decisions.md, "Issue 19, twelfth
    pass").

    With `in_flight`, at most that many calls run at once (per event loop): keys asked for
    while they run wait for one to end and then go together, however many turns they
    arrived in. A call alone is still made at once, and under load the batches grow instead
    of the calls (docs/decisions.md, "Issue 19, fourteenth pass"). Without it, each turn's
    call starts at once.

    `read_many` takes the keys and returns one result per key, in order; a result that is
    an exception is raised to its caller alone. If `read_many` raises for a batch of several
    keys, each key is read again on its own, so a key whose read fails fails alone (its
    caller gets the exception) and the others get their answers: a `read_many` that writes
    must then have written nothing (services.task_send_new). A caller that stops waiting (a
    client gone) leaves the others' reads as they are.
    """

    def __init__(
        self,
        read_many: Callable[[list[K]], list[T]],
        *,
        most: int = 64,
        in_flight: int | None = None,
    ) -> None:
        self._read_many = read_many
        self._most = most
        self._in_flight = in_flight
        # Per event loop (tests run many): the keys waiting, the calls running.
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue[K]] = (
            weakref.WeakKeyDictionary()
        )
        self._running: set[asyncio.Task] = set()  # held: the loop keeps only weak references

    async def __call__(self, key: K) -> T:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = _Queue()
        queue.waiting.append((key, future))
        self._flush_soon(loop, queue)
        return await future

    def _flush_soon(self, loop: asyncio.AbstractEventLoop, queue: _Queue[K]) -> None:
        """At the end of this turn, unless a flush is due already or no call may start."""
        if queue.waiting and not queue.flush_due and self._may_start(queue):
            queue.flush_due = True
            loop.call_soon(self._flush, loop, queue)

    def _flush(self, loop: asyncio.AbstractEventLoop, queue: _Queue[K]) -> None:
        queue.flush_due = False
        # A caller that stopped waiting before its call began is left out of it.
        queue.waiting = [(key, future) for key, future in queue.waiting if not future.done()]
        while queue.waiting and self._may_start(queue):
            batch, queue.waiting = queue.waiting[: self._most], queue.waiting[self._most :]
            queue.running += 1
            task = loop.create_task(self._read(batch))
            self._running.add(task)
            task.add_done_callback(functools.partial(self._ended, loop, queue))

    def _may_start(self, queue: _Queue[K]) -> bool:
        return self._in_flight is None or queue.running < self._in_flight

    def _ended(self, loop: asyncio.AbstractEventLoop, queue: _Queue[K], task: asyncio.Task):
        self._running.discard(task)
        queue.running -= 1
        self._flush_soon(loop, queue)

    async def _read(self, batch: list[tuple[K, asyncio.Future]]) -> None:
        keys = [key for key, _ in batch]
        try:
            answers = list(zip(batch, await run_orm(lambda: self._read_many(keys)), strict=True))
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0][1], exception=exc)
            else:
                await asyncio.gather(*(self._read([one]) for one in batch))
            return
        for (_, future), result in answers:
            if isinstance(result, Exception):
                _settle(future, exception=result)
            else:
                _settle(future, result=result)


def _settle(future: asyncio.Future, *, result: object = None, exception: Exception | None = None):
    if future.done():  # its caller stopped waiting
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


def shutdown() -> None:
    """Close the threads' connections (process shutdown)."""
    global _executor
    if _executor is not None:
        # One close per thread: the barrier keeps a thread from taking two of the jobs.
        threads = settings.A2A_ORM_THREADS
        barrier = threading.Barrier(threads, timeout=5)

        def close() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()
            connections.close_all()

        futures = [_executor.submit(close) for _ in range(threads)]
        for f in futures:
            f.result(timeout=10)
        _executor.shutdown(wait=False)
        _executor = None
