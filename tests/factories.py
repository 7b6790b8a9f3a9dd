"""Factories for the test suite (one place)."""

from __future__ import annotations

import uuid

import factory

from agents.models import Agent
from agents.signing import signing_key_create_for_new_agent


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
