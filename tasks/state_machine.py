"""The pure A2A task state machine: the transition table and the one check that enforces it.

No Django import: this module is the rulebook, the lifecycle services are the only callers that
act on it. See docs/decisions.md for why the table is what it is.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from tasks.states import TERMINAL_STATES, TaskState

S = TaskState

TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    S.SUBMITTED: frozenset({S.WORKING, S.INPUT_REQUIRED, S.AUTH_REQUIRED} | TERMINAL_STATES),
    # WORKING -> WORKING is a progress update (a new status message), not a no-op.
    S.WORKING: frozenset(
        {S.WORKING, S.INPUT_REQUIRED, S.AUTH_REQUIRED, S.COMPLETED, S.FAILED, S.CANCELED}
    ),
    S.INPUT_REQUIRED: frozenset({S.WORKING, S.COMPLETED, S.FAILED, S.CANCELED}),
    S.AUTH_REQUIRED: frozenset({S.WORKING, S.FAILED, S.CANCELED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELED: frozenset(),
    S.REJECTED: frozenset(),
}

TIMESTAMP_STEP = timedelta(milliseconds=1)


class IllegalTransition(Exception):
    """A move the table forbids. `terminal` tells a finished task apart from a wrong order."""

    def __init__(self, from_state: TaskState, to_state: TaskState) -> None:
        self.from_state = TaskState(from_state)
        self.to_state = TaskState(to_state)
        self.terminal = self.from_state in TERMINAL_STATES
        if self.terminal:
            reason = f"task is {self.from_state.short}, a terminal state"
        else:
            reason = f"{self.from_state.short} cannot move to {self.to_state.short}"
        super().__init__(f"illegal transition: {reason}")


def check_transition(from_state: TaskState, to_state: TaskState) -> None:
    """Raise IllegalTransition unless `from_state -> to_state` is in the table."""
    if TaskState(to_state) not in TRANSITIONS[TaskState(from_state)]:
        raise IllegalTransition(from_state, to_state)


def next_status_timestamp(previous: datetime | None, now: datetime) -> datetime:
    """Status timestamps strictly increase per task, at millisecond precision.

    Clocks step backwards and two writes can land in the same millisecond; clients order by
    this value (ListTasks sorts by it), so it is max(now, previous + 1 ms), truncated to ms.
    """
    now = now.replace(microsecond=(now.microsecond // 1000) * 1000)
    if previous is not None and now <= previous:
        return previous + TIMESTAMP_STEP
    return now
