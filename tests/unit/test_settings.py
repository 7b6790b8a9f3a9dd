"""The production profile refuses to start with insecure settings (a fresh interpreter each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD_SECRET_KEY = "k" * 20 + "-production-secret-key-0123456789"
# A Fernet key: 32 url-safe base64-encoded bytes.
GOOD_FERNET_KEY = "x" * 43 + "="
# The value settings.py falls back to; passed explicitly so a developer's .env cannot mask it.
DEFAULT_SECRET_KEY = "dev-insecure-secret-key-change-me"
# Variables these tests control; the rest of the environment is passed through.
CONTROLLED = {"A2A_PROFILE", "DEBUG", "SECRET_KEY", "A2A_SECRETS_KEYS", "ALLOWED_HOSTS"}

PROBLEM_DEBUG = "DEBUG is on"
PROBLEM_SECRET = "SECRET_KEY is the default or shorter than 32 characters"
PROBLEM_KEYS = "A2A_SECRETS_KEYS (encryption key for secrets at rest) is not set"


def start(
    tmp_path: Path,
    code: str = "import django; django.setup()",
    *,
    unset: tuple[str, ...] = (),
    **overrides: str,
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter on a good production environment, `overrides` on top
    and the variables in `unset` removed (so a developer's shell cannot mask a default)."""
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED and k not in unset}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "a2a_platform.settings",
            "A2A_PROFILE": "production",
            "DEBUG": "false",
            "SECRET_KEY": GOOD_SECRET_KEY,
            "A2A_SECRETS_KEYS": GOOD_FERNET_KEY,
            "ALLOWED_HOSTS": "agents.example.com",
            "A2A_VAR_DIR": str(tmp_path),
            **overrides,
        }
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_production_starts_with_good_settings(tmp_path):
    result = start(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "refusing" not in result.stderr


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"DEBUG": "true"}, PROBLEM_DEBUG),
        ({"DEBUG": "1"}, PROBLEM_DEBUG),
        ({"SECRET_KEY": DEFAULT_SECRET_KEY}, PROBLEM_SECRET),
        ({"SECRET_KEY": "short-but-not-the-default"}, PROBLEM_SECRET),
        ({"A2A_SECRETS_KEYS": ""}, PROBLEM_KEYS),
    ],
    ids=["debug-true", "debug-1", "default-secret-key", "short-secret-key", "no-secrets-keys"],
)
def test_production_refuses_an_insecure_setting(tmp_path, overrides, problem):
    result = start(tmp_path, **overrides)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "refusing to start in production" in result.stderr
    assert problem in result.stderr
    # Only the problem that is there is named.
    others = {PROBLEM_DEBUG, PROBLEM_SECRET, PROBLEM_KEYS} - {problem}
    assert not [p for p in others if p in result.stderr]


def test_production_names_every_problem_at_once(tmp_path):
    result = start(tmp_path, DEBUG="true", SECRET_KEY=DEFAULT_SECRET_KEY, A2A_SECRETS_KEYS="")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "django.core.exceptions.ImproperlyConfigured: refusing to start in production: "
        f"{PROBLEM_DEBUG}; {PROBLEM_SECRET}; {PROBLEM_KEYS}"
    )


def test_development_profile_accepts_the_same_settings(tmp_path):
    result = start(
        tmp_path,
        A2A_PROFILE="development",
        DEBUG="true",
        SECRET_KEY=DEFAULT_SECRET_KEY,
        A2A_SECRETS_KEYS="",
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("profile", ["development", "test", "production"])
def test_every_profile_has_the_production_cache_ttls(tmp_path, profile):
    """No profile switches the hot-path caches off: the tests run the cached path production
    runs (docs/decisions.md, "Tests and CI")."""
    caches = (
        "A2A_AGENT_CACHE_SECONDS",
        "A2A_API_KEY_CACHE_SECONDS",
        "A2A_SIGNING_KEY_CACHE_SECONDS",
    )
    code = (
        "import django; django.setup(); from django.conf import settings; "
        f"print(*(getattr(settings, name) for name in {caches!r}))"
    )
    result = start(tmp_path, code, unset=caches, A2A_PROFILE=profile)
    assert result.returncode == 0, result.stderr
    assert [float(x) for x in result.stdout.split()] == [2, 5, 5]


JOB_LOGGERS = ("celery.worker.strategy", "celery.app.trace", "celery.beat")
LEVELS = (
    "import django, logging; django.setup(); "
    "print(' '.join(logging.getLevelName(logging.getLogger(n).getEffectiveLevel()) "
    f"for n in {JOB_LOGGERS + ('tasks.lifecycle', 'tasks')!r}))"
)


@pytest.mark.parametrize("profile", ["development", "test", "production"])
def test_job_log_lines_are_quiet_by_default_and_the_platform_logs_info(tmp_path, profile):
    """Celery's per-job lines (the heartbeat and sweeps print several every few seconds of
    nothing happening) and the platform's per-task lines (several a task) default to
    WARNING; the platform's other loggers stay at INFO."""
    unset = ("A2A_JOB_LOG_LEVEL", "A2A_TASK_LOG_LEVEL", "LOG_LEVEL")
    result = start(tmp_path, LEVELS, unset=unset, A2A_PROFILE=profile)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["WARNING"] * 4 + ["INFO"]


def test_a2a_job_log_level_shows_every_job(tmp_path):
    unset = ("LOG_LEVEL", "A2A_TASK_LOG_LEVEL")
    result = start(tmp_path, LEVELS, unset=unset, A2A_JOB_LOG_LEVEL="INFO")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["INFO"] * 3 + ["WARNING", "INFO"]


def test_a2a_task_log_level_shows_every_step_of_every_task(tmp_path):
    unset = ("LOG_LEVEL", "A2A_JOB_LOG_LEVEL")
    result = start(tmp_path, LEVELS, unset=unset, A2A_TASK_LOG_LEVEL="INFO")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["WARNING"] * 3 + ["INFO", "INFO"]
