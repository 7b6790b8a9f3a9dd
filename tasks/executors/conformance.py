"""`conformance`: an agent for conformance runs (the A2A TCK and the like), whose tasks stay
WORKING until the client says otherwise, as the official SDKs' test agents' tasks do: a suite
can then get, list, cancel and subscribe to a task that is still in flight.

Each client message (the first included) moves the task to WORKING and adds an artifact
echoing the message; the task then stays WORKING. A message tells it otherwise by its text
(the whole text, trimmed, any case) or by its metadata key `conformance`:

    complete         end COMPLETED
    fail             end FAILED
    input-required   move to INPUT_REQUIRED (the next client message continues)

Cancel ends it CANCELED as for any task. Nothing depends on message ids. A blocking
SendMessage waits for a settled state (terminal or interrupted) at most
A2A_SEND_MESSAGE_MAX_WAIT_SECONDS, then answers the task as it is (WORKING): conformance runs
set that wait short. Documented for clients in docs/executors.md. Run again after a crash, it
resumes: a message's echo artifact is sent once.
"""

from __future__ import annotations

from tasks.executors.base import ExecutorContext, RunAgain
from tasks.states import TERMINAL_STATES, TaskState
from tasks.wire import message_text

METADATA_KEY = "conformance"
COMMANDS = {
    "complete": TaskState.COMPLETED,
    "fail": TaskState.FAILED,
    "input-required": TaskState.INPUT_REQUIRED,
}
_TEXT = {
    TaskState.COMPLETED: None,
    TaskState.FAILED: "failed as the client asked",
    TaskState.INPUT_REQUIRED: "send another message to continue",
}


def command(text: str, metadata: dict | None) -> TaskState | None:
    """The state a message asks for, or None (stay WORKING)."""
    asked = (metadata or {}).get(METADATA_KEY)
    if not isinstance(asked, str):
        asked = text
    return COMMANDS.get(asked.strip().lower())


def run(ctx: ExecutorContext) -> RunAgain | None:
    task = ctx.task()
    if task.task_state in TERMINAL_STATES:
        return None
    messages = ctx.user_messages()
    if task.state != TaskState.WORKING:
        ctx.working()
    if not messages:
        return None
    latest = messages[-1]
    echo_id = f"echo-{latest.pk}"
    if not ctx.artifact_chunks(echo_id)[1]:
        ctx.artifact(list(latest.parts), artifact_id=echo_id, name="echo", last_chunk=True)
    asked = command(message_text({"parts": latest.parts}), latest.metadata)
    if asked is not None:
        ctx.finish(asked, _TEXT[asked])
    return None
