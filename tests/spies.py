"""A spy on one of our own functions: every call recorded, each still made (the real function
runs: nothing is faked)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Call:
    at: float  # time.monotonic() when it was called
    kwargs: dict[str, Any]


def spy(monkeypatch, owner: object, name: str) -> list[Call]:
    """Replace `owner.name` (a function called with keyword arguments) for the test by one
    that records each call, then makes it; returns the list the calls are appended to."""
    calls: list[Call] = []
    real = getattr(owner, name)

    def recorded(**kwargs):
        calls.append(Call(time.monotonic(), kwargs))
        return real(**kwargs)

    monkeypatch.setattr(owner, name, recorded)
    return calls
