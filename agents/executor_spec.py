"""An agent's `executor` value: a built-in name, `external` (the worker API), or a hosted
a2a-sdk `AgentExecutor` named `python:<module>:<attribute>` (docs/agents.md).

Pure: nothing is imported here. Whether the named code imports and constructs is decided where
it runs, by each worker (tasks/executors/hosted.py), and reported to readiness: the web may not
have the agent's dependencies, so an import is never a save-time check.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

from django.core.exceptions import ValidationError

HOSTED_PREFIX = "python:"
BUILT_IN = ("echo", "scripted", "conformance")
EXTERNAL = "external"
MAX_LENGTH = 255

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class HostedSpec:
    """`python:<module>:<attribute>`: an AgentExecutor subclass (built with no arguments) or a
    zero-argument callable returning one."""

    module: str
    attribute: str

    def __str__(self) -> str:
        return f"{HOSTED_PREFIX}{self.module}:{self.attribute}"


def _identifier(part: str) -> bool:
    return bool(_IDENTIFIER.match(part)) and not keyword.iskeyword(part)


def is_hosted(executor: str) -> bool:
    """Whether an agent's `executor` value names a hosted executor (`python:…`)."""
    return executor.startswith(HOSTED_PREFIX)


def hosted_spec(value: str) -> HostedSpec | None:
    """The hosted executor `value` names, or None when it names a built-in or `external`.
    Raises ValidationError (code `invalid_executor`) for anything else, saying what is wrong."""
    if value in BUILT_IN or value == EXTERNAL:
        return None
    if not value.startswith(HOSTED_PREFIX):
        names = ", ".join((*BUILT_IN, EXTERNAL))
        raise ValidationError(
            f"unknown executor {value[:80]!r}: use one of {names}, or "
            "python:<module>:<attribute> for an a2a-sdk AgentExecutor",
            code="invalid_executor",
        )
    if len(value) > MAX_LENGTH:
        raise ValidationError(f"at most {MAX_LENGTH} characters", code="invalid_executor")
    module, sep, attribute = value.removeprefix(HOSTED_PREFIX).partition(":")
    if not sep or not module or not attribute:
        raise ValidationError(
            "python:<module>:<attribute>, e.g. python:my_pkg.agents:CurrencyAgentExecutor",
            code="invalid_executor",
        )
    if not all(_identifier(part) for part in module.split(".")):
        raise ValidationError(
            f"{module[:80]!r} is not a module path (dotted Python identifiers)",
            code="invalid_executor",
        )
    if not _identifier(attribute):
        raise ValidationError(
            f"{attribute[:80]!r} is not a Python identifier", code="invalid_executor"
        )
    return HostedSpec(module, attribute)


def validate_executor(value: str) -> None:
    """The model field's validator: a built-in name, `external`, or a well-formed hosted spec."""
    hosted_spec(value)
