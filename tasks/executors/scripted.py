"""`scripted`: a deterministic executor driven by the text of the first message.

The text is a script when every `;`-separated step is one of the commands below; any other
message is answered like `echo` and completes. Documented for clients in docs/executors.md.

    work N      stay WORKING for N seconds (re-enqueued with an ETA, never sleeping)
    chunks N    stream one artifact in N chunks (append, lastChunk on the last)
    ask         move to INPUT_REQUIRED; the next client message continues the script
    auth        move to AUTH_REQUIRED; the next client message continues the script
    fail        end FAILED
    reject      end REJECTED; as the first step only (a working task cannot be rejected,
                so a later `reject` fails the task as an executor error)
    message     answer with a direct Message (no task result)

After the last step the task completes with an artifact echoing the latest client message.
Finding its task canceled is a normal stop. Run again after a crash, it resumes: `chunks`
continues after the chunks already committed, the echo artifact is sent once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tasks.executors.base import ExecutorContext, RunAgain
from tasks.executors.echo import echo_once
from tasks.states import TaskState

MAX_SECONDS = 3600
MAX_CHUNKS = 1000

_STEP = re.compile(r"^(work|chunks)\s+(\d{1,4})$|^(ask|auth|fail|reject|message)$")


@dataclass(frozen=True)
class Step:
    verb: str
    count: int = 0


def parse_script(text: str) -> list[Step] | None:
    """The steps of a script, or None when the text is not one."""
    raw = [s.strip().lower() for s in text.strip().split(";") if s.strip()]
    if not raw:
        return None
    steps = []
    for item in raw:
        match = _STEP.match(item)
        if match is None:
            return None
        if match.group(1):
            limit = MAX_SECONDS if match.group(1) == "work" else MAX_CHUNKS
            steps.append(Step(match.group(1), min(int(match.group(2)), limit)))
        else:
            steps.append(Step(match.group(3)))
    return steps


def run(ctx: ExecutorContext) -> RunAgain | None:
    messages = ctx.user_messages()
    first_text = ""
    if messages:
        from tasks.wire import message_text

        first_text = message_text({"parts": messages[0].parts})
    steps = parse_script(first_text) or []
    pc = int(ctx.progress.get("pc", 0))
    task = ctx.task()
    # REJECTED is reachable only from SUBMITTED (state_machine.TRANSITIONS): a leading
    # `reject` declines the task without starting work on it. A leading `message` answers at
    # once, so the agent's first move is its reply (a stream then carries just that Message).
    direct = task.state == TaskState.SUBMITTED and steps[pc : pc + 1] in (
        [Step("reject")],
        [Step("message")],
    )
    if task.state != TaskState.WORKING and not direct:
        # Starting, or resuming after input/auth (the next client message continues).
        ctx.working()

    while pc < len(steps):
        step = steps[pc]
        if step.verb == "work":
            if not ctx.progress.get("waited"):
                ctx.progress["waited"] = True
                ctx.progress["pc"] = pc
                return RunAgain(step.count)
            ctx.progress["waited"] = False
        elif step.verb == "chunks":
            artifact_id = f"chunks-{pc}"
            # A re-run resumes after the chunks an earlier run committed (none repeated).
            done, complete = ctx.artifact_chunks(artifact_id)
            for i in range(step.count if complete else done, step.count):
                ctx.artifact(
                    [{"text": f"chunk {i + 1} of {step.count}"}],
                    artifact_id=artifact_id,
                    name="chunks",
                    append=i > 0,
                    last_chunk=i == step.count - 1,
                )
        elif step.verb in ("ask", "auth"):
            state = TaskState.INPUT_REQUIRED if step.verb == "ask" else TaskState.AUTH_REQUIRED
            prompt = "Please send more input." if step.verb == "ask" else "Please authenticate."
            ctx.finish(state, prompt)
            # Past the step only once the move committed: a run the database interrupted
            # asks again rather than skip the question.
            ctx.progress["pc"] = pc + 1
            return None
        elif step.verb == "fail":
            ctx.finish(TaskState.FAILED, "scripted failure")
            return None
        elif step.verb == "reject":
            ctx.finish(TaskState.REJECTED, "scripted rejection")
            return None
        elif step.verb == "message":
            ctx.reply(ctx.latest_user_text() or "ok")
            return None
        pc += 1
        ctx.progress["pc"] = pc

    echo_once(ctx)
    ctx.finish(TaskState.COMPLETED)
    return None
