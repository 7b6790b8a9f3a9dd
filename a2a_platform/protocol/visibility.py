"""A task as the caller may see it: the caller's own task or TaskNotFound (unknown and
foreign ids alike), and its snapshot as ProtoJSON."""

from __future__ import annotations

from a2a_platform.protocol.context import Ctx
from a2a_platform.protocol.errors import TASK_NOT_FOUND, ProtocolError
from tasks import wire
from tasks.models import Task
from tasks.selectors import task_artifacts, task_for_owner, task_history


def snapshot(task: Task, *, history_length: int | None, include_artifacts: bool = True) -> dict:
    """Task as ProtoJSON: history per historyLength (None all, 0 none, N newest N)."""
    history = task_history(task, history_length) if history_length != 0 else None
    artifacts = task_artifacts(task) if include_artifacts else None
    return wire.task_json(task, history=history, artifacts=artifacts)


def visible_task(ctx: Ctx, task_id: str) -> Task:
    """The caller's task, or TaskNotFound on the wire (unknown and foreign ids alike)."""
    task = task_for_owner(agent_id=ctx.agent.pk, owner=ctx.principal, task_id=task_id)
    if task is None:
        raise ProtocolError(TASK_NOT_FOUND, metadata={"taskId": task_id[:100]})
    return task
