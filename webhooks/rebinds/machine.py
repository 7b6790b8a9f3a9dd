"""The rebind state machine: which operation may move a rebind from which state (pure: no
Django, like tasks/state_machine.py). webhooks/rebinds/operations.py calls `check` before every
write.

    scheduled ──start──▶ preparing ──drain──▶ draining ──complete──▶ completed
        │                    │  └──cut_over──▶ cut_over ◀──cut_over──┘   │
        └──abort──▶ aborted ◀┴──abort─────────────────────abort──────────┘

`extend`, `move_now`, `finish_on_old` and `replay_notice` (an operator re-sends a dead-lettered
notice, webhooks/console/delivery_actions.py) keep a draining rebind draining; `rebind_orphans`
keeps a cut-over one cut over. A rebind whose policy is cutover goes from
preparing straight to cut_over. completed, cut_over and aborted are final.
"""

from __future__ import annotations

SCHEDULED = "scheduled"
PREPARING = "preparing"
DRAINING = "draining"
COMPLETED = "completed"
CUT_OVER = "cut_over"
ABORTED = "aborted"

# operation -> {from state: to state}
TRANSITIONS: dict[str, dict[str, str]] = {
    "start": {SCHEDULED: PREPARING},
    "drain": {PREPARING: DRAINING},
    "complete": {DRAINING: COMPLETED},
    "cut_over": {PREPARING: CUT_OVER, DRAINING: CUT_OVER},
    "extend": {DRAINING: DRAINING},
    # Decisions on single tasks of a draining rebind; re-binding a cut-over one's orphans.
    "move_now": {DRAINING: DRAINING},
    "finish_on_old": {DRAINING: DRAINING},
    "replay_notice": {DRAINING: DRAINING},
    "rebind_orphans": {CUT_OVER: CUT_OVER},
    "abort": {SCHEDULED: ABORTED, PREPARING: ABORTED, DRAINING: ABORTED},
}


class IllegalRebindTransition(Exception):
    """An operation the rebind's state does not allow (e.g. aborting a completed rebind)."""

    def __init__(self, operation: str, state: str) -> None:
        allowed = sorted(TRANSITIONS.get(operation, {}))
        super().__init__(
            f"cannot {operation.replace('_', ' ')} a rebind that is {state.replace('_', ' ')}"
            + (f" (only when {' or '.join(allowed)})" if allowed else "")
        )
        self.operation = operation
        self.state = state


def check(operation: str, state: str) -> str:
    """The state `operation` moves a rebind in `state` to; raises IllegalRebindTransition."""
    target = TRANSITIONS.get(operation, {}).get(state)
    if target is None:
        raise IllegalRebindTransition(operation, state)
    return target


def can(operation: str, state: str) -> bool:
    return state in TRANSITIONS.get(operation, {})


def deadline_used(elapsed: float, total: float) -> float:
    """How much of a drain's time is used: `elapsed` since its cutoff over its span to the
    deadline (extensions included), 1.0 once the span is empty. The deadline alerts and the
    metric `a2a_rebind_drain_deadline_ratio` read it."""
    return elapsed / total if total > 0 else 1.0


def alert_threshold(elapsed: float, total: float, already: int) -> int | None:
    """The deadline alert due now (50, 90 or 100 % of the drain's time used), if it is past
    one not alerted yet (`already`: the highest alerted so far, 0 for none)."""
    if total <= 0:
        return 100 if already < 100 else None
    used = 100 * deadline_used(elapsed, total)
    due = [t for t in (50, 90, 100) if used >= t and t > already]
    return due[-1] if due else None
