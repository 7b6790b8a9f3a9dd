"""The executors bench/hosted_bench.py hosts on both servers, the platform (as
`python:bench.hosted_agents:<attribute>`, the project root on the workers' PYTHONPATH) and
a2a-sdk's own `DefaultRequestHandler`: the same classes, written only against a2a-sdk's public
API, as an agent for the SDK's server would be.

    SleepAgentExecutor     WORKING, awaits 1 s (a model call's stand-in), one artifact, COMPLETED
    TrivialAgentExecutor   WORKING, one artifact, COMPLETED
"""

from __future__ import annotations

import asyncio

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Part, Task, TaskState, TaskStatus

SLEEP_SECONDS = 1.0


async def start_task(context: RequestContext, event_queue: EventQueue) -> TaskUpdater:
    """The task WORKING, created first when the server has none yet (the SDK's server calls a
    new task's first execute() without `current_task`; the platform hands the stored one).
    bench/sdk_server.py's echo starts the same way."""
    if context.current_task is None:
        await event_queue.enqueue_event(
            Task(
                id=context.task_id,
                context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message] if context.message else [],
            )
        )
    updater = TaskUpdater(event_queue, context.task_id, context.context_id)
    await updater.start_work()
    return updater


class _Cancelable(AgentExecutor):
    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class SleepAgentExecutor(_Cancelable):
    """WORKING, then an awaited 1 s (holding no thread: what a model call does), one
    artifact, COMPLETED."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = await start_task(context, event_queue)
        await asyncio.sleep(SLEEP_SECONDS)
        await updater.add_artifact([Part(text="slept")], name="result")
        await updater.complete()


class TrivialAgentExecutor(_Cancelable):
    """WORKING, one artifact, COMPLETED: the executor's own cost is nothing, so the figure is
    the server's cost of hosting it."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = await start_task(context, event_queue)
        await updater.add_artifact([Part(text=context.get_user_input())], name="result")
        await updater.complete()
