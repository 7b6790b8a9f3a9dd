"""Executors, by the name an Agent's `executor` field holds: the built-ins here, run by
tasks/executors/runner.py. Hosted a2a-sdk AgentExecutors (`python:<module>:<attribute>`) run on
each worker's host instead (tasks/executors/host.py); `external` ones on the worker API."""

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
