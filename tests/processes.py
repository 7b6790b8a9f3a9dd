"""Real platform processes for integration and fault tests (Celery worker, beat, web).

They run against the test database pytest-django created, on the test broker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_database_url() -> str:
    s = connection.settings_dict
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    auth = s.get("USER") or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{host}:{port}/{s['NAME']}"


def process_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": test_database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "A2A_PROFILE": "test",
            "PYTHONUNBUFFERED": "1",
            # Each job received and finished is logged: tests read worker logs for it.
            "A2A_JOB_LOG_LEVEL": "INFO",
        }
    )
    env.update({k: str(v) for k, v in overrides.items()})
    return env


class Proc:
    """A child process with its output in a log file (shown when a test fails)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the child)
        self.popen = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.name}: {needle!r} not seen in {timeout}s:\n{self.log()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
            self.popen.wait(timeout=30)

    def stop(self, timeout: float = 15) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def forget_broker_state() -> None:
    """Empty the test broker's Redis database once a test's processes are stopped, as the
    suite starts with it empty (tests/conftest.py): the messages a stopped worker left
    (a warm shutdown restores a running job's message to its queue, which the next test's
    worker would then run beside the jobs that test starts; a SIGKILLed worker's stay
    unacknowledged for kombu's visibility timeout, an hour) and the doorbells its jobs watched
    (a2a_platform/lib/doorbell.py: a drain killed while it lingered leaves its bell watched for
    up to its TTL, so the next test's first send would ring for a dead drain instead of
    publishing a job). No process of the test is left to need any of it."""
    url = settings.CELERY_BROKER_URL
    if url.startswith(("redis://", "rediss://")):
        import redis

        redis.Redis.from_url(url).flushdb()


def start_worker(
    log_dir: Path,
    name: str = "worker",
    queues: str = "agents,webhooks,heartbeat",
    concurrency: int = 2,
    pool: str | None = None,
    extra_args: tuple[str, ...] = (),
    **env: str,
) -> Proc:
    """A Celery worker; `pool` picks the execution pool (`threads` is the I/O-concurrent pool
    the webhooks queue runs on; default: Celery's prefork)."""
    proc = Proc(
        name,
        [
            str(BIN / "celery"),
            "-A",
            "a2a_platform",
            "worker",
            "-Q",
            queues,
            "-c",
            str(concurrency),
            *(["-P", pool] if pool else []),
            "-n",
            f"{name}@%h",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "INFO",
            *extra_args,
        ],
        process_env(**env),
        log_dir,
    )
    proc.wait_for_log("ready.")
    return proc


def start_beat(log_dir: Path, **env: str) -> Proc:
    proc = Proc(
        "beat",
        [
            str(BIN / "celery"),
            "-A",
            "a2a_platform",
            "beat",
            "--loglevel",
            "INFO",
            "--scheduler",
            "django_celery_beat.schedulers:DatabaseScheduler",
            "--schedule",
            str(log_dir / "beat-schedule"),
        ],
        process_env(**env),
        log_dir,
    )
    proc.wait_for_log("beat: Starting")
    return proc


def wait_until(
    predicate: Callable[[], object],
    timeout: float = 30,
    interval: float = 0.1,
    message: str = "condition",
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{message} not reached in {timeout}s")
