"""The ORM threads' scheduling (a2a_platform/lib/orm.py): woken by the event loop, they do
not preempt it (SCHED_BATCH), and they keep the priority they had. The platform runs on
Linux (Debian), where the policy exists: the test runs everywhere it is deployed."""

import asyncio
import os

from a2a_platform.lib.orm import run_orm


def test_an_orm_call_runs_on_a_thread_that_does_not_preempt_on_wakeup():
    policy, nice = asyncio.run(run_orm(lambda: (os.sched_getscheduler(0), os.nice(0))))
    assert policy == os.SCHED_BATCH
    assert nice == os.nice(0)  # the calling thread's: no lower priority
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's own is untouched
