"""What an executor sees: its task, the message that woke it, and verbs that call services.

Executors run on Celery queue `agents` and change the task only through the lifecycle
services (the verbs below). They never sleep: to wait they return `RunAgain(seconds)`, which
keeps the ETA in the dispatch row. A run may be run again (its worker killed, the database
restarted under it: tasks/executors/runner.py), so an executor resumes from the task's
history (`artifact_chunks`, the task's state) instead of repeating what was committed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks import services, wire
from tasks.models import Artifact, Message, MessageRole, Task
from tasks.states import TERMINAL_STATES, TaskState
from tasks.task_store import get_task_store


@dataclass(frozen=True)
class RunAgain:
    after_seconds: float


@dataclass
class ExecutorContext:
    task_id: str
    progress: dict[str, Any] = field(default_factory=dict)
    # A verb committed a terminal state: that transaction closed the task's dispatch too
    # (task_store.append_events), so the runner has no claim left to release.
    finished: bool = False
    # The latest user message's parts as the claim read them (a quick executor's claim:
    # tasks/dispatch.py dispatch_claim_due); None: read when asked.
    user_parts: list[dict[str, Any]] | None = None
    # The task row as a quick claim read it (not locked): the run's first answer writes
    # without locking the task when the task has not moved since (services.task_answer).
    claimed_task: Task | None = None
    # Run in a batch's transaction (runner._run_together): the run's first answer, from the
    # claim's row, is buffered for the runner to write with the batch's others (one statement,
    # services.task_answers); any other verb or read writes it first. An error rolls the
    # batch back, and the runner runs each claim again alone.
    batched: bool = False
    buffered_answer: services.Answer | None = None

    # --- reads ---------------------------------------------------------------------------
    def task(self) -> Task:
        self.write_buffered_answer()
        return Task.objects.select_related("agent").get(pk=self.task_id)

    def user_messages(self) -> list[Message]:
        self.write_buffered_answer()
        return list(
            Message.objects.filter(task_id=self.task_id, role=MessageRole.USER).order_by("id")
        )

    def artifact_chunks(self, artifact_id: str) -> tuple[int, bool]:
        """(chunks committed, last chunk seen) of one of the task's artifacts; (0, False) when
        it has none of that id. A re-run after a crash resumes from here (a resume, not a
        replay: what an earlier run committed is not sent again)."""
        self.write_buffered_answer()
        row = (
            Artifact.objects.filter(task_id=self.task_id, artifact_id=artifact_id)
            .values_list("chunks", "complete")
            .first()
        )
        return (row[0], row[1]) if row else (0, False)

    def latest_user_parts(self) -> list[dict[str, Any]] | None:
        """The parts of the task's latest user message (None: it has none), one column of one
        row: a quick executor's whole read (echo's, once per task), read with its claim when
        it was a quick one (a message that came after the claim is not this run's)."""
        if self.user_parts is not None:
            return self.user_parts
        return get_task_store().latest_user_parts(uuid.UUID(self.task_id))

    def latest_user_text(self) -> str:
        parts = self.latest_user_parts()
        return wire.message_text({"parts": parts}) if parts is not None else ""

    # --- verbs (each one lifecycle service call) -------------------------------------------
    def working(self, text: str | None = None) -> None:
        self.write_buffered_answer()
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
        self.write_buffered_answer()
        data: dict[str, Any] = {"artifactId": artifact_id, "parts": parts}
        if name:
            data["name"] = name
        services.task_add_artifact(
            task_id=self.task_id, artifact=data, append=append, last_chunk=last_chunk
        )
        return artifact_id

    def finish(self, state: TaskState, text: str | None = None) -> None:
        self.write_buffered_answer()
        services.task_transition(task_id=self.task_id, to_state=state, message=text)
        self.finished = state in TERMINAL_STATES

    def answer(
        self,
        parts: list[dict[str, Any]],
        *,
        artifact_id: str,
        name: str = "",
        state: TaskState = TaskState.COMPLETED,
        text: str | None = None,
    ) -> None:
        """WORKING (if still SUBMITTED), one complete artifact (unless a complete one of this
        id is committed: a resumed run), then `state`: one transaction
        (services.task_answer)."""
        data: dict[str, Any] = {"artifactId": artifact_id, "parts": parts}
        if name:
            data["name"] = name
        self.write_buffered_answer()
        seen, self.claimed_task = self.claimed_task, None
        if self.batched and seen is not None:
            # Written with the batch's other answers (write_buffered_answers), or before this
            # run's next verb or read.
            self.buffered_answer = services.Answer(self.task_id, data, state, text, seen)
        else:
            services.task_answer(
                task_id=self.task_id,
                artifact=data,
                to_state=state,
                message=text,
                seen=seen,
                savepoint=not self.batched,
            )
        self.finished = state in TERMINAL_STATES

    def write_buffered_answer(self) -> None:
        """Write the answer this batched run buffered, if any, on its own."""
        write_buffered_answers([self])

    def reply(self, text: str) -> None:
        self.write_buffered_answer()
        services.task_reply_with_message(task_id=self.task_id, message=text)
        self.finished = True  # answered with a message: COMPLETED


def write_buffered_answers(contexts: list[ExecutorContext]) -> None:
    """Write the answers these batched runs buffered, together (services.task_answers: one
    statement), inside the batch's transaction."""
    buffered = []
    for ctx in contexts:
        if ctx.buffered_answer is not None:
            buffered.append(ctx.buffered_answer)
            ctx.buffered_answer = None
    if buffered:
        services.task_answers(buffered)


Executor = Callable[[ExecutorContext], RunAgain | None]
