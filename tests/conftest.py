"""Suite-wide set-up: the real servers must be reachable, the broker starts empty."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import pytest
from django.conf import settings

pytest_plugins = ["tests.fixtures"]


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def pytest_configure(config: pytest.Config) -> None:
    problems = []
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        host, port = db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)
        if not _reachable(host, port):
            problems.append(
                f"PostgreSQL is unreachable at {host}:{port}. Start it "
                "(pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start) "
                "or point A2A_TEST_DATABASE_URL at one."
            )
    broker = urlparse(settings.CELERY_BROKER_URL)
    if broker.scheme.startswith("redis"):
        host, port = broker.hostname or "127.0.0.1", broker.port or 6379
        if not _reachable(host, port):
            problems.append(
                f"Redis is unreachable at {host}:{port}. Start it "
                "(redis-server --daemonize yes --port 6379) or point A2A_TEST_BROKER_URL at one."
            )
    if problems:
        pytest.exit("\n".join(problems), returncode=3)


@pytest.fixture(scope="session", autouse=True)
def _empty_broker():
    """A test run starts with no leftover broker messages from an earlier run."""
    broker = urlparse(settings.CELERY_BROKER_URL)
    if broker.scheme.startswith("redis"):
        import redis

        redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


@pytest.fixture(autouse=True)
def _fresh_process_caches():
    """Each test starts with this process's TTL caches (agents, API keys, signing keys, served
    cards) empty, as Django empties its caches between tests: the suite runs with the
    production TTLs, and an entry left by an earlier test (an agent or key since rolled back
    or flushed, whose pk or slug a later test reuses) must not answer for it. Changes a test
    makes itself are seen through the production path: the change's commit drops this
    process's entries (protocol/context.py, webhooks/delivery/claim_record.py), and other processes
    wait for the TTL (tests/integration/test_cache_bounds.py)."""
    from a2a_platform.lib import ttl_cache

    for cache in list(ttl_cache._instances):
        cache.clear()


@pytest.fixture(scope="session", autouse=True)
def _close_orm_threads(django_db_setup, django_db_blocker):
    """The protocol app's ORM threads keep their connections; close them before the test
    database is dropped."""
    yield
    from a2a_platform.lib import orm

    with django_db_blocker.unblock():
        orm.shutdown()


@pytest.fixture(scope="session", autouse=True)
def _flush_retried_after_a_deadlock():
    """A transactional test's data is flushed after it (TRUNCATE of every table). A live
    worker still recording a delivery the test caused can hold a lock the TRUNCATE needs
    while waiting on one it holds; PostgreSQL then rolls one of them back as a deadlock.
    When the flush is the one rolled back, nothing of it happened, and running it again is
    the remedy PostgreSQL's documentation gives: up to three tries. Any other failure, and
    a third deadlock, surface as they are."""
    from django.core.management.base import CommandError
    from django.core.management.commands import flush
    from psycopg.errors import DeadlockDetected

    handle = flush.Command.handle

    def handle_retried(self, **options):
        for _ in range(2):
            try:
                return handle(self, **options)
            except CommandError as exc:
                # CommandError from Django's OperationalError from psycopg's error.
                if not isinstance(getattr(exc.__cause__, "__cause__", None), DeadlockDetected):
                    raise
        return handle(self, **options)

    flush.Command.handle = handle_retried
    yield
    flush.Command.handle = handle
