"""`echo`: answers with an artifact echoing the input, then completes.

WORKING, the artifact and COMPLETED are one transaction (ExecutorContext.answer), so a run
killed midway committed nothing of its answer. Run again after a crash, it resumes: the echo
artifact is sent once (its id is fixed, and a committed one is not sent again, e.g. one an
earlier version of this executor committed in a transaction of its own), then the task
completes.
"""

from __future__ import annotations

from tasks.executors.base import ExecutorContext, RunAgain

ECHO_ARTIFACT_ID = "echo"


def echo_parts(ctx: ExecutorContext) -> list[dict]:
    parts = ctx.latest_user_parts()
    return list(parts) if parts is not None else [{"text": ""}]


def echo_once(ctx: ExecutorContext) -> None:
    """The echo artifact, unless an earlier run of this task committed it (one per task: it
    comes right before completion)."""
    if not ctx.artifact_chunks(ECHO_ARTIFACT_ID)[1]:
        ctx.artifact(echo_parts(ctx), artifact_id=ECHO_ARTIFACT_ID, name="echo", last_chunk=True)


def run(ctx: ExecutorContext) -> RunAgain | None:
    ctx.answer(echo_parts(ctx), artifact_id=ECHO_ARTIFACT_ID, name="echo")
    return None
