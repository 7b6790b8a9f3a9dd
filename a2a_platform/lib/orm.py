"""Short ORM calls from async code, on a small fixed set of threads.

Each of the `A2A_ORM_THREADS` threads keeps the one pooled connection it checked out, so a
call costs a thread hop and the queries, not a pool checkout; the number of database
connections a web process uses is bounded by the thread count however many requests wait on
the event hub (waiters hold no connection). A call that fails closes its thread's connection,
so the next call starts from a clean one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.conf import settings
from django.db import connections

T = TypeVar("T")

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
