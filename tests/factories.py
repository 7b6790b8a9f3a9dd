"""Factories for the test suite (one place)."""

from __future__ import annotations

import uuid

import factory

from agents.models import Agent


class AgentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Agent

    slug = factory.Sequence(lambda n: f"agent-{n}")
    name = factory.LazyAttribute(lambda o: f"Agent {o.slug}")
    description = "test agent"
    executor = "echo"
    default_input_modes = ["text/plain"]
    default_output_modes = ["text/plain"]


def user_message(text: str = "hello", **extra) -> dict:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **extra}
