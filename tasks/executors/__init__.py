"""Built-in executors, by the name an Agent's `executor` field holds."""

from __future__ import annotations

from tasks.executors import conformance, echo, scripted
from tasks.executors.base import Executor

REGISTRY: dict[str, Executor] = {
    "echo": echo.run,
    "scripted": scripted.run,
    "conformance": conformance.run,
}


def get_executor(name: str) -> Executor | None:
    return REGISTRY.get(name)
