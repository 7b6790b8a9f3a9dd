"""Hosted executors for the tests (`python:tests.hosted_agents:<attribute>`): for readiness,
one that loads, a factory, and code that does not; for runs on a real worker
(tests/integration/tasks/test_hosted_executor.py, the project root on its PYTHONPATH),
executors that misbehave or answer in ways the example agent does not."""

from __future__ import annotations

import asyncio
import json
import os

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Role, TaskArtifactUpdateEvent, TaskState

from examples.currency_agent.agent import CurrencyAgentExecutor


class QuietExecutor(AgentExecutor):
    """Loads; does nothing (readiness only asks whether it constructs)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


def make_quiet() -> QuietExecutor:
    return QuietExecutor()


class NeedsArguments(QuietExecutor):
    def __init__(self, api_key: str) -> None:
        self.api_key = api_key


class NotAnExecutor:
    pass


def make_nothing() -> None:
    return None


# --- runs on a real worker ----------------------------------------------------------------


class _NoCancel(AgentExecutor):
    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


class Raising(_NoCancel):
    """Starts, then raises with a detail that must not reach the wire."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).start_work()
        raise RuntimeError("rate service down at postgres://secret@db/rates")


class Misbehaving(_NoCancel):
    """Sends the invalid event the message's text names."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        what = context.get_user_input().strip()
        if what == "other-task":
            await TaskUpdater(event_queue, "not-this-task", context.context_id).complete()
        elif what == "illegal-move":
            await updater.submit()  # WORKING -> SUBMITTED: the state machine refuses it
        elif what == "unknown-append":
            await event_queue.enqueue_event(
                TaskArtifactUpdateEvent(
                    task_id=context.task_id,
                    context_id=context.context_id,
                    artifact={"artifact_id": "never-started", "parts": [Part(text="x")]},
                    append=True,
                )
            )
        # Whatever comes after a refused event is never written.
        await updater.complete()


class ReturnsEarly(_NoCancel):
    """Starts work, then returns without finishing the task (nothing else could finish it)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id, context.context_id).start_work()


class DirectAnswer(_NoCancel):
    """Answers with one Message, no task work."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await event_queue.enqueue_event(
            Message(
                role=Role.ROLE_AGENT,
                message_id="answer-1",
                context_id=context.context_id,
                task_id=context.task_id,
                parts=[Part(text=f"you said: {context.get_user_input()}")],
            )
        )


def currency_factory() -> AgentExecutor:
    """A zero-argument callable returning an AgentExecutor (the other form a spec may name)."""
    return CurrencyAgentExecutor()


class TickingCurrency(CurrencyAgentExecutor):
    """The example currency agent with one more answer: "tick <n> [<seconds>]" starts work and
    streams n chunks of one artifact, 0.1 s (or <seconds>) apart, then completes: a run still
    writing events while an operator's rebind begins (tests/integration/webhooks/
    test_hosted_push.py). Any other message is the currency agent's."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        words = context.get_user_input().split()
        if words[:1] != ["tick"]:
            await super().execute(context, event_queue)
            return
        ticks = int(words[1])
        pause = float(words[2]) if len(words) > 2 else 0.1
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        for i in range(ticks):
            await asyncio.sleep(pause)
            await updater.add_artifact(
                [Part(text=f"{i} ")],
                artifact_id="ticks",
                name="ticks",
                append=i > 0,
                last_chunk=i == ticks - 1,
            )
        await updater.complete()


# --- failures on real workers (tests/integration/tasks/test_hosted_failures.py) ------------
# Each run writes what it did as one JSON line to the file MARKS_FILE_ENV names, with the
# worker WORKER_NAME_ENV names: the test then knows which process ran execute(), whether it
# was cancelled, and what the stored task looked like to a re-run.
MARKS_FILE_ENV = "A2A_TEST_HOSTED_MARKS"
WORKER_NAME_ENV = "A2A_TEST_HOSTED_WORKER"


def mark(event: str, context: RequestContext, **facts: object) -> None:
    """Append `event` with the process that saw it (one short O_APPEND write per line, so
    lines from several worker processes never interleave)."""
    path = os.environ.get(MARKS_FILE_ENV)
    if not path:
        return
    line = {
        "event": event,
        "task": context.task_id,
        "worker": os.environ.get(WORKER_NAME_ENV, ""),
        "pid": os.getpid(),
        **facts,
    }
    with open(path, "a") as marks:
        marks.write(json.dumps(line) + "\n")


def _stored_state(context: RequestContext) -> str | None:
    task = context.current_task
    return TaskState.Name(task.status.state) if task is not None else None


class Hangs(AgentExecutor):
    """Starts work (unless a previous run did), then waits until cancelled: a model call that
    never answers. Marks `execute`, `cancel` and `execute cancelled`."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        state = _stored_state(context)
        mark("execute", context, state=state)
        if state == "TASK_STATE_SUBMITTED":
            await TaskUpdater(event_queue, context.task_id, context.context_id).start_work()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            mark("execute cancelled", context)
            raise

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        mark("cancel", context)


class ResumesFromTheStoredTask(AgentExecutor):
    """Writes a report in two chunks of one artifact with a stable id, as docs/agents.md
    advises an at-least-once executor to: a run that finds the first chunk in `current_task`
    appends the second and completes; one that does not starts work, writes the first chunk,
    then waits for a model call that does not answer (its worker is killed there). Marks
    `execute` with the stored state and artifacts it saw, and `first chunk committed`."""

    ARTIFACT_ID = "report"

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        stored = context.current_task
        artifacts = {a.artifact_id: [p.text for p in a.parts] for a in stored.artifacts}
        mark("execute", context, state=_stored_state(context), artifacts=artifacts)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if self.ARTIFACT_ID not in artifacts:
            if stored.status.state == TaskState.TASK_STATE_SUBMITTED:
                await updater.start_work()
            await updater.add_artifact(
                [Part(text="part 1")], artifact_id=self.ARTIFACT_ID, name="report"
            )
            mark("first chunk committed", context)
            await asyncio.sleep(3600)
        await updater.add_artifact(
            [Part(text="part 2")],
            artifact_id=self.ARTIFACT_ID,
            name="report",
            append=True,
            last_chunk=True,
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None
