"""Executors, by the name an Agent's `executor` field holds: the built-ins, and hosted a2a-sdk
AgentExecutors named `python:<module>:<attribute>` (tasks/executors/hosted.py)."""

from __future__ import annotations

import functools

from django.core.exceptions import ValidationError

from agents.executor_spec import HOSTED_PREFIX, hosted_spec
from tasks.executors import conformance, echo, scripted
from tasks.executors.base import Executor

REGISTRY: dict[str, Executor] = {
    "echo": echo.run,
    "scripted": scripted.run,
    "conformance": conformance.run,
}


def get_executor(name: str) -> Executor | None:
    if name.startswith(HOSTED_PREFIX):
        return _hosted(name)
    return REGISTRY.get(name)


@functools.lru_cache(maxsize=256)
def _hosted(name: str) -> Executor | None:
    """A hosted executor's run, as the runner calls executors (None: not a well-formed name)."""
    from tasks.executors import hosted  # the a2a-sdk server modules, only where one runs

    try:
        spec = hosted_spec(name)
    except ValidationError:
        return None
    return functools.partial(hosted.run, spec) if spec is not None else None
