"""A PostgreSQL server of the test's own, for the database outage tests (tests/fault/*/
test_postgres_*.py): initdb + pg_ctl from the machine's PostgreSQL 15 binaries into a
temporary directory, on a free port, trust auth. A test restarts or stops IT, never the
machine's server (other test runs and benchmarks use that one).

`private_postgres` (a module fixture) starts it, creates and migrates a database, and points
this process's default connection at it for the module's tests, so the test's ORM reads,
pytest-django's flush after each test and the processes it starts (tests.processes reads the
connection's settings) all use it; the machine's test database is restored afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
import pytest
from django.core.management import call_command
from django.db import connections

from a2a_platform.lib.reconnect import database_unreachable, fresh_connection
from tests.live import free_port

PG_BIN = Path(os.environ.get("A2A_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
DB_NAME = "a2a_fault"
T = TypeVar("T")


def _as_postgres(cmd: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the `postgres` user then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


class PostgresServer:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="a2a-fault-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.port = free_port()

    def _pg(self, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            _as_postgres([str(PG_BIN / args[0]), *args[1:]]),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )

    def init(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync",
                 "-E", "UTF8", "--locale", "C")  # fmt: skip
        self.start()

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off -c max_connections=300"
        )
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-o", options, "-w",
                 "-t", "60", "start")  # fmt: skip

    def stop(self) -> None:
        """A fast shutdown: every connection is dropped (clients see AdminShutdown)."""
        self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def restart(self, *, down_for: float = 0.0) -> None:
        """`pg_ctl restart -m fast`; with `down_for`, a stop, that long down, then a start (a
        restart of a loaded production server takes seconds; this idle one takes 0.3 s)."""
        if not down_for:
            self._pg("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "restart")
            return
        self.stop()
        time.sleep(down_for)
        self.start()

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self._pg("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self, name: str) -> None:
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _repoint(settings_dict: dict) -> None:
    conn = connections["default"]
    conn.close()
    conn.close_pool()
    conn.settings_dict.clear()
    conn.settings_dict.update(settings_dict)


@pytest.fixture(scope="module")
def private_postgres(django_db_setup, django_db_blocker):
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"{PG_BIN}/initdb is missing (PostgreSQL 15's server binaries)")
    server = PostgresServer()
    conn = connections["default"]
    saved = dict(conn.settings_dict)
    try:
        server.init()
        server.create_database(DB_NAME)
        with django_db_blocker.unblock():
            _repoint(
                {
                    **saved,
                    "HOST": "127.0.0.1",
                    "PORT": str(server.port),
                    "NAME": DB_NAME,
                    "USER": "postgres",
                    "PASSWORD": "",
                }  # fmt: skip
            )
            call_command("migrate", interactive=False, verbosity=0)
        yield server
    finally:
        with django_db_blocker.unblock():
            _repoint(saved)
        print(f"----- private PostgreSQL log (tail) -----\n{server.log()[-4000:]}")  # noqa: T201
        server.destroy()


def riding_out(fn: Callable[[], T]) -> Callable[[], T | None]:
    """`fn` for a polling loop run across an outage: None (not yet) while this process's
    database connection is unreachable, and a fresh connection for the next poll."""

    def poll() -> T | None:
        try:
            return fn()
        except Exception as exc:
            if not database_unreachable(exc):
                raise
            fresh_connection()
            time.sleep(0.2)
            return None

    return poll
