"""Domain errors raised by the lifecycle services; the protocol and API layers map them."""

from __future__ import annotations

from tasks.state_machine import IllegalTransition

__all__ = [
    "DispatchLeaseLost",
    "IllegalTransition",
    "InvalidPayload",
    "NotExternalExecutor",
    "TaskError",
    "TaskNotFound",
    "TaskTerminal",
]


class TaskError(Exception):
    """Base class of errors a caller's input can cause."""


class TaskNotFound(TaskError):
    def __init__(self, task_id: object) -> None:
        self.task_id = str(task_id)
        super().__init__(f"task {self.task_id} not found")


class TaskTerminal(TaskError):
    """A message or change sent to a task that already finished."""

    def __init__(self, task_id: object, state: str) -> None:
        self.task_id = str(task_id)
        self.state = state
        super().__init__(f"task {self.task_id} is in terminal state {state}")


class InvalidPayload(TaskError):
    """A message, part or artifact that breaks the A2A data model.

    `field` is a dotted path (e.g. `message.parts[0]`), as in google.rpc.BadRequest.
    """

    def __init__(self, field: str, description: str) -> None:
        self.field = field
        self.description = description
        super().__init__(f"{field}: {description}")


class NotExternalExecutor(TaskError):
    """A worker claim for an agent whose dispatches a built-in (Celery) executor runs: a claim
    there would race the executor job."""

    def __init__(self, agent_slug: str, executor: str) -> None:
        self.agent_slug = agent_slug
        self.executor = executor
        super().__init__(
            f"agent {agent_slug} runs the built-in {executor} executor; only agents with "
            "executor=external are worked through this API"
        )


class DispatchLeaseLost(TaskError):
    """A renew or release of a dispatch whose lease is not the caller's (it lapsed and the
    dispatch was swept, the task finished, or the caller never claimed it): `lease_lost` on
    the worker API. The message keeps the API's wording."""

    def __init__(self, dispatch_id: int) -> None:
        self.dispatch_id = dispatch_id
        super().__init__("this dispatch is not held by you")
