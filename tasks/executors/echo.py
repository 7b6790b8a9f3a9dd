"""`echo`: answers with an artifact echoing the input, then completes."""

from __future__ import annotations

from tasks.executors.base import ExecutorContext, RunAgain
from tasks.states import TaskState


def echo_parts(ctx: ExecutorContext) -> list[dict]:
    messages = ctx.user_messages()
    return list(messages[-1].parts) if messages else [{"text": ""}]


def run(ctx: ExecutorContext) -> RunAgain | None:
    task = ctx.task()
    if task.state == TaskState.SUBMITTED:
        ctx.working()
    ctx.artifact(echo_parts(ctx), name="echo", last_chunk=True)
    ctx.finish(TaskState.COMPLETED)
    return None
