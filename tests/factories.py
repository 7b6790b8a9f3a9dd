"""Factories for the test suite (one place)."""

from __future__ import annotations

import uuid

import factory
from django.db import transaction

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
    """A task opened for a client's first message, in the caller's transaction (not durable:
    a test may call it inside one) and without an idempotency receipt, which SendMessage's
    write (`services.task_send`) claims for authenticated callers.

    One transaction: Task (SUBMITTED), the message in its history, TaskEvent seq 1 and an
    executor dispatch. After commit: the executor job is enqueued (built-in executors).
    """
    msg = services._as_message(message)
    with transaction.atomic():
        task, _ = services._open_task(
            agent=agent, owner=owner, msg=msg, context_id=context_id, metadata=metadata
        )
    services.lifecycle_log.info(
        "task created", extra={"task_id": str(task.id), "agent": agent.slug}
    )
    return task
