"""Fixtures of the fault tests: `private_postgres`, a PostgreSQL server of the test's own
(tests/fault/postgres.py)."""

from tests.fault.postgres import private_postgres  # noqa: F401
