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
    core (docs/decisions.md, "Web and worker processes"). Same priority otherwise; a no-op
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


class Coalesced(Generic[K, T]):
    """One read for many callers: `await coalesced(key)` returns `read_many([...])`'s result
    for `key`, where the list holds every key asked for in the same turn of the event loop
    (at most `most`; more make several calls). One ORM call, one thread hop and one
    statement serve them all, instead of one each (docs/decisions.md, "Coalesced reads and
    writes").

    `read_many` takes the keys and returns one result per key, in order; a result that is
    an exception is raised to its caller alone. If `read_many` raises for a batch of several
    keys, each key is read again on its own, so a key whose read fails fails alone (its
    caller gets the exception) and the others get their answers: a `read_many` that writes
    must then have written nothing (services.task_send_new). A caller that stops waiting (a
    client gone) leaves the others' reads as they are.
    """

    def __init__(self, read_many: Callable[[list[K]], list[T]], *, most: int = 64) -> None:
        self._read_many = read_many
        self._most = most
        # Per event loop (tests run many): the keys waiting for this turn's call.
        self._waiting: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, list[tuple[K, asyncio.Future]]
        ] = weakref.WeakKeyDictionary()
        self._running: set[asyncio.Task] = set()  # kept: the loop keeps only weak references

    async def __call__(self, key: K) -> T:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        waiting = self._waiting.setdefault(loop, [])
        waiting.append((key, future))
        if len(waiting) == 1:
            loop.call_soon(self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting = self._waiting.pop(loop, [])
        for start in range(0, len(waiting), self._most):
            task = loop.create_task(self._read(waiting[start : start + self._most]))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

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
