"""Shared bench helpers: a fresh PostgreSQL database, platform processes, a load loop.

Every bench takes `--database NAME` (the database it creates afresh on the server of
A2A_BENCH_PG, default its own name) and `--smoke` (tiny parameters, every phase still run: what
tests/bench/test_bench_smoke.py runs in `make test`, so a rename breaks the suite rather than
a figure). The broker is A2A_BENCH_BROKER_URL's. Benchmarks call the platform's public entry
points only (services, selectors, the protocol over HTTP or ASGI, management commands): no
private function is imported or wrapped; phases are timed around public calls or read from
outside (rows' timestamps, pg_stat_activity, /proc).
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PG = os.environ.get("A2A_BENCH_PG", "postgres://postgres@127.0.0.1:5432")
BROKER = os.environ.get("A2A_BENCH_BROKER_URL", "redis://127.0.0.1:6379/14")


# The benches' default agent: the echo executor, served at the root.
ECHO_AGENT = ("create_agent", "bench", "--name", "Bench", "--description", "bench")
ECHO_AGENT += ("--executor", "echo", "--default")


def add_common_args(parser, database: str) -> None:
    """`--database` (default `database`) and `--smoke`, which every bench takes."""
    parser.add_argument(
        "--database",
        default=database,
        help=f"the database created afresh on A2A_BENCH_PG's server (default {database})",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny parameters, every phase run once: a check that the bench runs, not a figure",
    )


def load_average() -> str:
    """The machine's 1-minute load average, printed beside figures (the cores are shared)."""
    return f"{os.getloadavg()[0]:.2f}"


def fresh_database(name: str) -> str:
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG}/{name}"
    env = platform_env(url)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    return url


def platform_env(database_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url,
            "CELERY_BROKER_URL": BROKER,
            "A2A_PROFILE": "test",
            "LOG_LEVEL": "INFO",
            "A2A_JOB_LOG_LEVEL": "INFO",  # the delivery bench counts jobs from worker logs
            "A2A_AGENT_CACHE_SECONDS": "2",
            "A2A_API_KEY_CACHE_SECONDS": "5",
            "A2A_SIGNING_KEY_CACHE_SECONDS": "5",
            **extra,
        }
    )
    return env


def manage(database_url: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=platform_env(database_url),
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


class Procs:
    """Platform processes for a bench. `prefix` goes before every command (e.g. `taskset -c 0`
    to pin the server side); `env`, when given, replaces the environment each one gets."""

    def __init__(self, prefix: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.procs: list[subprocess.Popen] = []
        self.prefix = prefix or []
        self.env = env

    def start(
        self, cmd: list[str], env: dict[str, str], name: str | None = None
    ) -> subprocess.Popen:
        log_dir = ROOT / "var" / "bench"
        log_dir.mkdir(parents=True, exist_ok=True)
        name = name or f"{Path(cmd[0]).name}-{len(self.procs)}"
        log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [*self.prefix, *cmd],
            cwd=ROOT,
            env=self.env or env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def web(
        self,
        database_url: str,
        port: int,
        workers: int = 1,
        name: str | None = None,
        **extra_env: str,
    ) -> None:
        """uvicorn on `port` (log var/bench/<name>.log, extra environment `extra_env`);
        returns once /healthz answers."""
        proc = self.start(
            [
                str(BIN / "uvicorn"),
                "a2a_platform.asgi:application",
                "--port",
                str(port),
                "--workers",
                str(workers),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            platform_env(database_url, **extra_env),
            name=name,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"web exited with {proc.returncode}; see var/bench/")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("web did not start")

    def celery_worker(
        self,
        database_url: str,
        name: str,
        *,
        queues: str = "agents",
        pool: str | None = None,
        concurrency: int = 2,
        wait: bool = True,
        **extra_env: str,
    ) -> subprocess.Popen:
        """A Celery worker (`-n name@%h`, log var/bench/<name>.log); `wait` until it is ready."""
        cmd = [str(BIN / "celery"), "-A", "a2a_platform", "worker", "-Q", queues]
        cmd += ["-n", f"{name}@%h"]
        cmd += ["-P", pool] if pool else []
        cmd += ["-c", str(concurrency), "--without-gossip", "--without-mingle", "-l", "INFO"]
        proc = self.start(cmd, platform_env(database_url, **extra_env), name=name)
        if wait:
            self.wait_ready(proc, name)
        return proc

    def beat(self, database_url: str, name: str = "beat", **extra_env: str) -> subprocess.Popen:
        """celery beat on the database scheduler, with the schedules `sync_schedules` writes."""
        manage(database_url, "sync_schedules")
        cmd = [str(BIN / "celery"), "-A", "a2a_platform", "beat", "-l", "INFO"]
        cmd += ["--scheduler", "django_celery_beat.schedulers:DatabaseScheduler"]
        cmd += ["--schedule", str(ROOT / "var" / "bench" / f"{name}-schedule")]
        return self.start(cmd, platform_env(database_url, **extra_env), name=name)

    def wait_ready(self, proc: subprocess.Popen, name: str, timeout: float = 60) -> None:
        log = ROOT / "var" / "bench" / f"{name}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {log}")
            if log.exists() and " ready." in log.read_text(errors="replace"):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not start; see {log}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def purge_broker() -> None:
    import redis

    redis.Redis.from_url(BROKER).flushdb()


async def load(
    call: Callable[[httpx.AsyncClient, int], Awaitable[httpx.Response]],
    *,
    concurrency: int,
    duration: float,
    base_url: str,
) -> dict:
    latencies: list[float] = []
    errors = 0
    counter = 0
    stop_at = time.monotonic() + duration
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:

        async def one_user() -> None:
            nonlocal errors, counter
            while time.monotonic() < stop_at:
                counter += 1
                started = time.perf_counter()
                try:
                    resp = await call(client, counter)
                    ok = resp.status_code in (200, 304)
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - started)
                errors += not ok

        started = time.monotonic()
        await asyncio.gather(*(one_user() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000 if latencies else 0,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000 if latencies else 0,
    }


def row(name: str, concurrency: int, r: dict) -> str:
    return (
        f"{name:<34} c={concurrency:<3} {r['rps']:>8.0f} req/s  p50 {r['p50_ms']:>7.1f} ms  "
        f"p99 {r['p99_ms']:>7.1f} ms  ({r['requests']} requests, {r['errors']} errors)"
    )
