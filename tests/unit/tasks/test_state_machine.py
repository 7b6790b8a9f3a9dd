from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.state_machine import (
    TRANSITIONS,
    IllegalTransition,
    check_transition,
    next_status_timestamp,
)
from tasks.states import INTERRUPTED_STATES, TERMINAL_STATES, TaskState

S = TaskState


def test_check_transition_terminal_states_never_change():
    for terminal in TERMINAL_STATES:
        for target in TaskState:
            with pytest.raises(IllegalTransition) as exc:
                check_transition(terminal, target)
            assert exc.value.terminal


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (S.SUBMITTED, S.WORKING),
        (S.SUBMITTED, S.REJECTED),
        (S.WORKING, S.WORKING),
        (S.WORKING, S.INPUT_REQUIRED),
        (S.INPUT_REQUIRED, S.COMPLETED),
        (S.AUTH_REQUIRED, S.WORKING),
    ],
)
def test_check_transition_allows_table_moves(src, dst):
    check_transition(src, dst)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (S.WORKING, S.SUBMITTED),
        (S.WORKING, S.REJECTED),
        (S.AUTH_REQUIRED, S.COMPLETED),
        (S.INPUT_REQUIRED, S.AUTH_REQUIRED),
        (S.SUBMITTED, S.SUBMITTED),
    ],
)
def test_check_transition_refuses_moves_outside_table(src, dst):
    with pytest.raises(IllegalTransition) as exc:
        check_transition(src, dst)
    assert not exc.value.terminal
    assert src.short in str(exc.value)


def test_transition_table_covers_every_state():
    assert set(TRANSITIONS) == set(TaskState)
    for interrupted in INTERRUPTED_STATES:
        assert S.WORKING in TRANSITIONS[interrupted]


_base = datetime(2026, 1, 1, tzinfo=UTC)
clock_steps = st.lists(st.integers(min_value=-5000, max_value=5000), min_size=1, max_size=60)


# The oracle: docs/decisions.md "Transition table", written out here rather than read from
# TRANSITIONS, so a wrong entry in the production table makes the model below disagree.
_ALLOWED = {
    (S.SUBMITTED, t)
    for t in (S.WORKING, S.INPUT_REQUIRED, S.AUTH_REQUIRED, S.COMPLETED, S.FAILED, S.CANCELED)
} | {(S.SUBMITTED, S.REJECTED)}
_ALLOWED |= {
    (S.WORKING, t)
    for t in (S.WORKING, S.INPUT_REQUIRED, S.AUTH_REQUIRED, S.COMPLETED, S.FAILED, S.CANCELED)
}
_ALLOWED |= {(S.INPUT_REQUIRED, t) for t in (S.WORKING, S.COMPLETED, S.FAILED, S.CANCELED)}
_ALLOWED |= {(S.AUTH_REQUIRED, t) for t in (S.WORKING, S.FAILED, S.CANCELED)}


def _expected_stamp(previous: datetime, now: datetime) -> datetime:
    """docs/decisions.md "Status timestamps": max(now, previous + 1 ms), truncated to ms."""
    truncated = now.replace(microsecond=now.microsecond // 1000 * 1000)
    return max(truncated, previous + timedelta(milliseconds=1))


def test_oracle_matches_the_table_pair_by_pair():
    for src in TaskState:
        for dst in TaskState:
            allowed = (src, dst) in _ALLOWED
            assert (dst in TRANSITIONS[src]) == allowed, (src, dst)


@given(targets=st.lists(st.sampled_from(list(TaskState)), max_size=40), steps=clock_steps)
def test_random_sequences_keep_invariants(targets, steps):
    """Replaying random moves as the services do, against the independent model above: a move
    is accepted exactly when the documented table allows it (so nothing leaves a terminal
    state), and each accepted move's status timestamp is exactly max(now, previous + 1 ms) at
    ms precision, strictly increasing even when the clock jumps backwards or stands still.
    (The gap-free `seq` is the services' job: tests/integration/tasks/test_services.py.)"""
    state = S.SUBMITTED
    stamp = next_status_timestamp(None, _base)
    assert stamp == _base
    now = _base
    for i, target in enumerate(targets):
        now = now + timedelta(microseconds=steps[i % len(steps)] * 100)
        if (state, target) not in _ALLOWED:
            with pytest.raises(IllegalTransition) as refused:
                check_transition(state, target)
            assert refused.value.terminal == (state in TERMINAL_STATES)
            continue
        check_transition(state, target)  # allowed: raises nothing
        new_stamp = next_status_timestamp(stamp, now)
        assert new_stamp == _expected_stamp(stamp, now)
        assert new_stamp > stamp
        state, stamp = target, new_stamp


def test_next_status_timestamp_truncates_to_milliseconds():
    now = datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    assert next_status_timestamp(None, now).microsecond == 123000


def test_next_status_timestamp_steps_past_a_backwards_clock():
    prev = datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert next_status_timestamp(prev, prev - timedelta(seconds=3)) == prev + timedelta(
        milliseconds=1
    )


def test_state_machine_imports_no_django():
    import subprocess
    import sys

    code = (
        "import sys; import tasks.state_machine; "
        "assert not [m for m in sys.modules if m.startswith('django')], 'django imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
