"""CurrencyAgentExecutor: converts an amount between currencies, written only against
a2a-sdk's public API (AgentExecutor, RequestContext, EventQueue, TaskUpdater), as an agent for
the SDK's own server would be.

    "100 USD to EUR"     WORKING, an artifact streamed in two chunks, COMPLETED
    "100 USD"            INPUT_REQUIRED ("Which currency …?"); the next message ("EUR")
                         finishes the conversion on the same task
    "… slowly"           the rate lookup takes a minute: time for a client to cancel it

The rates are a fixed table: the example is about the agent's shape, not about money.
"""

from __future__ import annotations

import asyncio
import logging
import re

from a2a.helpers import get_message_text, new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Part, Role

logger = logging.getLogger(__name__)

# Units of each currency one US dollar buys.
PER_USD = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.0, "CHF": 0.88}
SLOW_LOOKUP_SECONDS = 60.0

_AMOUNT = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]{3})\b")
# "… to EUR", or a message that is just a currency code (the answer to "Which currency?").
_TARGET = re.compile(
    r"\b(?:to|in|into)\s+([A-Za-z]{3})\b|^\s*([A-Za-z]{3})\s*$", re.IGNORECASE | re.MULTILINE
)


def _conversation(context: RequestContext) -> str:
    """The user's messages on this task, oldest first, the current one last."""
    texts = []
    seen = set()
    if context.current_task is not None:
        for message in context.current_task.history:
            if message.role == Role.ROLE_USER:
                texts.append(get_message_text(message))
                seen.add(message.message_id)
    if context.message is not None and context.message.message_id not in seen:
        texts.append(get_message_text(context.message))
    return "\n".join(texts)


class CurrencyAgentExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None:  # the SDK's server calls a new task's first execute() without one
            task = new_task_from_user_message(context.message)
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)

        def say(text: str):
            return updater.new_agent_message([Part(text=text)])

        text = _conversation(context)
        await updater.start_work(say("Looking up the exchange rate…"))
        if "slowly" in text.lower():
            await asyncio.sleep(SLOW_LOOKUP_SECONDS)

        amount = _AMOUNT.search(text)
        if amount is None:
            await updater.requires_input(say("How much of which currency? e.g. 100 USD"))
            return
        value, source = float(amount.group(1)), amount.group(2).upper()
        targets = [m.group(1) or m.group(2) for m in _TARGET.finditer(text)]
        target = targets[-1].upper() if targets else None
        if target is None or source not in PER_USD or target not in PER_USD:
            known = ", ".join(PER_USD)
            await updater.requires_input(
                say(f"Which currency should I convert {value:g} {source} to? I know {known}.")
            )
            return

        result = value / PER_USD[source] * PER_USD[target]
        artifact_id = f"conversion-{task.id}"
        await updater.add_artifact(
            [Part(text=f"{value:g} {source} = ")], artifact_id=artifact_id, name="conversion"
        )
        await updater.add_artifact(
            [Part(text=f"{result:.2f} {target}")],
            artifact_id=artifact_id,
            name="conversion",
            append=True,
            last_chunk=True,
        )
        await updater.complete(say(f"{value:g} {source} is {result:.2f} {target}."))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        logger.info("currency agent: cancel of task %s", context.task_id)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()
