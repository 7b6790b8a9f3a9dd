"""Factories for the test suite (one place)."""

from __future__ import annotations

import uuid

import factory

from agents.models import Agent
from agents.signing import signing_key_create_for_new_agent
from tasks import services
from tasks.models import Task


class AgentFactory(factory.django.DjangoModelFactory):
    """An agent with its first active signing key, written with the helper agent_create uses
    (`signing_key_create_for_new_agent`), as production gives every agent one.
    `signing_key=False` makes a keyless agent, as one made outside the services would be (the
    signing tests start from one)."""

    class Meta:
        model = Agent
        skip_postgeneration_save = True

    slug = factory.Sequence(lambda n: f"agent-{n}")
    name = factory.LazyAttribute(lambda o: f"Agent {o.slug}")
    description = "test agent"
    executor = "echo"
    default_input_modes = ["text/plain"]
    default_output_modes = ["text/plain"]

    @factory.post_generation
    def signing_key(agent: Agent, create: bool, extracted: bool | None, **_) -> None:
        if create and extracted is not False:
            signing_key_create_for_new_agent(agent)


def user_message(text: str = "hello", **extra) -> dict:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **extra}


def task_create(
    *,
    agent: Agent,
    owner: str,
    message: services.MessageInput,
    context_id: str | None = None,
    metadata: dict | None = None,
) -> Task:
    """A task opened for a client's first message through SendMessage's own write
    (`services.task_send`: the Task, its message, TaskEvent seq 1 and the executor dispatch,
    as the protocol stores them), for tests whose subject is what happens to the task next.
    `context_id` is the message's contextId, as a client would send it."""
    if context_id is not None:
        if isinstance(message, dict):
            message = {**message, "contextId": context_id}
        else:
            message.context_id = context_id
    return services.task_send(agent=agent, owner=owner, message=message, metadata=metadata).task
