"""Celery's per-job lines are quiet by default (the heartbeat and sweeps would print several
lines every few seconds of nothing happening) and come back with A2A_JOB_LOG_LEVEL=INFO."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOGGERS = ("celery.worker.strategy", "celery.app.trace", "celery.beat")
PROBE = (
    "import django, logging; django.setup(); "
    "print(' '.join(logging.getLevelName(logging.getLogger(n).getEffectiveLevel()) "
    f"for n in {LOGGERS!r}), logging.getLevelName(logging.getLogger('tasks').getEffectiveLevel()))"
)


def levels(tmp_path: Path, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("A2A_JOB_LOG_LEVEL", "LOG_LEVEL")}
    environ.update(
        {"DJANGO_SETTINGS_MODULE": "a2a_platform.settings", "A2A_VAR_DIR": str(tmp_path), **env}
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=environ, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("profile", ["development", "production", "test"])
def test_job_lines_are_warning_by_default_and_the_platform_logs_info(tmp_path, profile):
    extra = {}
    if profile == "production":
        extra = {"DEBUG": "false", "SECRET_KEY": "k" * 40, "A2A_SECRETS_KEYS": "x" * 43 + "="}
        extra["ALLOWED_HOSTS"] = "agents.example.com"
    assert levels(tmp_path, A2A_PROFILE=profile, **extra) == ["WARNING"] * 3 + ["INFO"]


def test_a2a_job_log_level_shows_every_job(tmp_path):
    assert levels(tmp_path, A2A_JOB_LOG_LEVEL="INFO") == ["INFO"] * 4
