"""The task states' groups are defined once (tasks/states.py); the stored values of the
terminal states are `TERMINAL_VALUES`, which every query and every set of values uses rather
than recomputing it (issue 44)."""

from __future__ import annotations

import re
from pathlib import Path

from tasks.states import IN_FLIGHT_VALUES, TERMINAL_STATES, TERMINAL_VALUES, TaskState

ROOT = Path(__file__).resolve().parents[3]
APPS = ("a2a_platform", "agents", "tasks", "webhooks")
# `[s.value for s in TERMINAL_STATES]` and its kin; a literal list of the four terminal states.
RECOMPUTED = re.compile(
    r"for \w+ in TERMINAL_STATES|"
    r"COMPLETED,\s*\w*\.?FAILED,\s*\w*\.?CANCELED,\s*\w*\.?REJECTED|"
    r"\"TASK_STATE_COMPLETED\",\s*\"TASK_STATE_FAILED\""
)


def test_terminal_values_are_the_terminal_states_values():
    assert set(TERMINAL_VALUES) == {s.value for s in TERMINAL_STATES}
    assert set(TERMINAL_VALUES) | set(IN_FLIGHT_VALUES) == {s.value for s in TaskState}
    assert not set(TERMINAL_VALUES) & set(IN_FLIGHT_VALUES)


def test_no_module_recomputes_the_terminal_values():
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts or path == ROOT / "tasks" / "states.py":
                continue
            text = path.read_text(encoding="utf-8")
            found += [
                f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
                for m in RECOMPUTED.finditer(text)
            ]
    assert found == [], "use tasks.states.TERMINAL_VALUES"
