"""The rebind state machine (webhooks/rebinds/machine.py): pure, no database."""

from __future__ import annotations

import pytest

from webhooks.rebinds import machine as m

STATES = [m.SCHEDULED, m.PREPARING, m.DRAINING, m.COMPLETED, m.CUT_OVER, m.ABORTED]
FINAL = [m.COMPLETED, m.CUT_OVER, m.ABORTED]  # the module docstring's final states
ALLOWED = {
    ("start", m.SCHEDULED): m.PREPARING,
    ("drain", m.PREPARING): m.DRAINING,
    ("complete", m.DRAINING): m.COMPLETED,
    ("cut_over", m.PREPARING): m.CUT_OVER,
    ("cut_over", m.DRAINING): m.CUT_OVER,
    ("extend", m.DRAINING): m.DRAINING,
    ("move_now", m.DRAINING): m.DRAINING,
    ("finish_on_old", m.DRAINING): m.DRAINING,
    ("rebind_orphans", m.CUT_OVER): m.CUT_OVER,
    ("abort", m.SCHEDULED): m.ABORTED,
    ("abort", m.PREPARING): m.ABORTED,
    ("abort", m.DRAINING): m.ABORTED,
}


@pytest.mark.parametrize("operation", sorted({op for op, _ in ALLOWED}))
@pytest.mark.parametrize("state", STATES)
def test_every_operation_in_every_state(operation, state):
    expected = ALLOWED.get((operation, state))
    if expected is None:
        assert not m.can(operation, state)
        with pytest.raises(m.IllegalRebindTransition) as refused:
            m.check(operation, state)
        assert state.replace("_", " ") in str(refused.value)
    else:
        assert m.can(operation, state)
        assert m.check(operation, state) == expected


def test_final_states_allow_nothing_but_re_binding_orphans():
    for state in FINAL:
        allowed = {op for op in m.TRANSITIONS if m.can(op, state)}
        assert allowed <= {"rebind_orphans"}


def test_an_unknown_operation_is_refused():
    with pytest.raises(m.IllegalRebindTransition):
        m.check("teleport", m.DRAINING)


@pytest.mark.parametrize(
    ("elapsed", "total", "already", "due"),
    [
        (49, 100, 0, None),
        (50, 100, 0, 50),
        (95, 100, 0, 90),  # jumped past two: the highest one due
        (95, 100, 90, None),
        (100, 100, 90, 100),
        (150, 100, 100, None),
        (0, 0, 0, 100),  # no time at all: the deadline is already here
    ],
)
def test_deadline_alert_thresholds(elapsed, total, already, due):
    assert m.alert_threshold(elapsed, total, already) == due
