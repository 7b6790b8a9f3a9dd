"""What an executor sees: its task, the message that woke it, and verbs that call services.

Executors run on Celery queue `agents` and change the task only through the lifecycle
services (the verbs below). They never sleep: to wait they return `RunAgain(seconds)`, which
keeps the ETA in the dispatch row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks import services, wire
from tasks.models import Message, MessageRole, Task
from tasks.states import TaskState


@dataclass(frozen=True)
class RunAgain:
    after_seconds: float


@dataclass
class ExecutorContext:
    task_id: str
    progress: dict[str, Any] = field(default_factory=dict)

    # --- reads ---------------------------------------------------------------------------
    def task(self) -> Task:
        return Task.objects.select_related("agent").get(pk=self.task_id)

    def user_messages(self) -> list[Message]:
        return list(
            Message.objects.filter(task_id=self.task_id, role=MessageRole.USER).order_by("id")
        )

    def latest_user_text(self) -> str:
        messages = self.user_messages()
        return wire.message_text({"parts": messages[-1].parts}) if messages else ""

    # --- verbs (each one lifecycle service call) -------------------------------------------
    def working(self, text: str | None = None) -> None:
        services.task_transition(task_id=self.task_id, to_state=TaskState.WORKING, message=text)

    def artifact(
        self,
        parts: list[dict[str, Any]],
        *,
        artifact_id: str | None = None,
        name: str = "",
        append: bool = False,
        last_chunk: bool = False,
    ) -> str:
        artifact_id = artifact_id or str(uuid.uuid4())
        data: dict[str, Any] = {"artifactId": artifact_id, "parts": parts}
        if name:
            data["name"] = name
        services.task_add_artifact(
            task_id=self.task_id, artifact=data, append=append, last_chunk=last_chunk
        )
        return artifact_id

    def finish(self, state: TaskState, text: str | None = None) -> None:
        services.task_transition(task_id=self.task_id, to_state=state, message=text)

    def reply(self, text: str) -> None:
        services.task_reply_with_message(task_id=self.task_id, message=text)


Executor = Callable[[ExecutorContext], RunAgain | None]
