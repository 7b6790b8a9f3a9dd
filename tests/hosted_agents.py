"""Hosted executors for the tests (`python:tests.hosted_agents:<attribute>`): for readiness,
one that loads, a factory, and code that does not; for runs on a real worker
(tests/integration/tasks/test_hosted_executor.py, the project root on its PYTHONPATH),
executors that misbehave or answer in ways the example agent does not."""

from __future__ import annotations

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Role, TaskArtifactUpdateEvent

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
