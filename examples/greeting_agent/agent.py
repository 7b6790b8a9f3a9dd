"""GreetingAgentExecutor: answers greetings, written only against a2a-sdk's public API
(AgentExecutor, RequestContext, EventQueue, TaskUpdater). It follows the hello-world sample
that ships with a2a-sdk: a task, a "working" note, a pause standing for the model's call, one
artifact with the reply, completed; cancel() forgets the task and reports it CANCELED.

    "hello" / "how are you" / "bye"   WORKING, one "reply" artifact, COMPLETED
    anything else                     the same, the reply echoing the text
    "help"                            a direct Message answer, no task (the sample has none;
                                      it shows the other kind of answer an executor gives)
    "… take your time"                the pause lasts a minute: time for a client to cancel

No model, no network: the example is about the executor's shape.
"""

from __future__ import annotations

import asyncio
import logging
import re

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Role, Task, TaskState, TaskStatus

logger = logging.getLogger(__name__)

# The sample's simulated processing time; a message asking for patience stretches it.
THINKING_SECONDS = 1.0
PATIENT_THINKING_SECONDS = 60.0
HELP_TEXT = (
    "I answer greetings (hello, how are you, goodbye) and echo anything else. "
    "Add 'take your time' and I think for a minute."
)


def reply_to(text: str) -> str:
    """The answer to the user's text, chosen by the words it contains."""
    if not text.strip():
        return "Say something and I will answer."
    words = set(re.findall(r"[a-z']+", text.lower()))
    if words & {"hello", "hi", "hey"}:
        return "Hello! Nice to meet you."
    if "how are you" in text.lower():
        return "Very well, thank you. What can I do for you?"
    if words & {"bye", "goodbye"}:
        return "Goodbye, and have a good day!"
    return f"You said: '{text}'. Thank you for your message."


class GreetingAgentExecutor(AgentExecutor):
    """Runs one greeting per task; remembers which tasks are in flight so a cancel() that
    arrives during the pause stops the reply from being published."""

    def __init__(self) -> None:
        self._in_flight: set[str] = set()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        if text.strip().lower() == "help":
            await event_queue.enqueue_event(
                Message(
                    role=Role.ROLE_AGENT,
                    message_id=f"help-{context.task_id}",
                    context_id=context.context_id,
                    parts=[Part(text=HELP_TEXT)],
                )
            )
            return

        if context.current_task is None:  # a new task: the executor announces it
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context.context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        self._in_flight.add(context.task_id)
        try:
            await updater.start_work(
                updater.new_agent_message([Part(text="Thinking about your message…")])
            )
            patient = "take your time" in text.lower()
            await asyncio.sleep(PATIENT_THINKING_SECONDS if patient else THINKING_SECONDS)
            if context.task_id not in self._in_flight:  # canceled while thinking
                return
            await updater.add_artifact([Part(text=reply_to(text))], name="reply", last_chunk=True)
            await updater.complete()
        finally:
            self._in_flight.discard(context.task_id)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        logger.info("greeting agent: cancel of task %s", context.task_id)
        self._in_flight.discard(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()
