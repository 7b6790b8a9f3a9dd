"""Browser tests' shared fixtures: where their screenshots go."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts" / "e2e"


@pytest.fixture
def artifacts(request) -> Path:
    """A directory for this test's full-page screenshots, under var/ (git-ignored), kept
    after the run; its path is printed in the terminal summary."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    path = ARTIFACTS / name
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.png"):
        old.unlink()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    yield path
    if reporter is not None:
        shots = sorted(p.name for p in path.glob("*.png"))
        reporter.write_line(f"\n{request.node.name}: screenshots in {path}: {', '.join(shots)}")
