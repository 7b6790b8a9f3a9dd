"""`load_check`: what a worker reports to readiness about a hosted executor (no database)."""

from __future__ import annotations

import pytest

from tasks.executors.hosted import load_check


@pytest.mark.parametrize(
    "spec", ["python:tests.hosted_agents:QuietExecutor", "python:tests.hosted_agents:make_quiet"]
)
def test_load_check_a_class_or_factory_that_builds_an_executor_loads(spec):
    assert load_check(spec) is None


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("python:no_such_module:X", "ModuleNotFoundError: No module named 'no_such_module'"),
        ("python:tests.hosted_agents:Missing", "AttributeError: module 'tests.hosted_agents'"),
        ("python:tests.hosted_agents:NeedsArguments", "TypeError: "),
        ("python:tests.hosted_agents:NotAnExecutor", "TypeError: "),
        ("python:tests.hosted_agents:make_nothing", "returned NoneType, not an AgentExecutor"),
        ("echo", "names no hosted executor"),
    ],
)
def test_load_check_says_why_in_one_short_line(spec, reason):
    why = load_check(spec)
    assert why is not None
    assert reason in why
    assert "\n" not in why
    assert len(why) <= 300
