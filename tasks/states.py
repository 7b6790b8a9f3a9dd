"""A2A task states and their groups, importable without touching the ORM.

Values are the proto enum names (`lf.a2a.v1.TaskState`), so rows map to ProtoJSON as they are.
"""

from enum import StrEnum


class TaskState(StrEnum):
    SUBMITTED = "TASK_STATE_SUBMITTED"
    WORKING = "TASK_STATE_WORKING"
    INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
    AUTH_REQUIRED = "TASK_STATE_AUTH_REQUIRED"
    COMPLETED = "TASK_STATE_COMPLETED"
    FAILED = "TASK_STATE_FAILED"
    CANCELED = "TASK_STATE_CANCELED"
    REJECTED = "TASK_STATE_REJECTED"

    @property
    def short(self) -> str:
        """The v0.3 / human name: `input-required`."""
        return self.value.removeprefix("TASK_STATE_").lower().replace("_", "-")


TERMINAL_STATES = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED}
)
INTERRUPTED_STATES = frozenset({TaskState.INPUT_REQUIRED, TaskState.AUTH_REQUIRED})
# A stream or blocking SendMessage stops waiting once the task is in one of these.
SETTLED_STATES = TERMINAL_STATES | INTERRUPTED_STATES
# The values as stored (for queries): the terminal states and the others (in flight).
TERMINAL_VALUES = tuple(sorted(s.value for s in TERMINAL_STATES))
IN_FLIGHT_VALUES = tuple(s.value for s in TaskState if s not in TERMINAL_STATES)
