"""Timestamps on PostgreSQL connections load with psycopg's default (compiled) loader
(a2a_platform/lib/pg_timestamps.py) and read back exactly as Django's own loader reads them,
the oracle here: same instant, same `tzinfo` object, same errors."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import DataError, connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.pq import Format

from a2a_platform.lib import pg_timestamps
from a2a_platform.lib.pg_timestamps import TIMESTAMPTZ_OID, use_compiled_loader

# PostgreSQL's loaders: the suite runs on PostgreSQL (Makefile's A2A_TEST_DATABASE_URL); on
# any other database these tests fail rather than pass by skipping.
pytestmark = pytest.mark.django_db

STAMPS = st.datetimes(
    min_value=datetime(1, 1, 1, 0, 0, 1),  # noqa: DTZ001 (hypothesis bounds are naive)
    max_value=datetime(9999, 12, 31, 23, 59, 58),  # noqa: DTZ001
    timezones=st.just(UTC),
)


def _loader():
    return connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)


def _read(sql: str, params: list, *, djangos: bool) -> list:
    """The values of `sql`, loaded by this connection's loader or (`djangos`) by Django's,
    registered on that cursor only."""
    with connection.cursor() as cursor:
        if djangos:
            register_tzloader(connection.timezone, cursor.cursor)
        cursor.execute(sql, params)
        return [value for row in cursor.fetchall() for value in row]


def test_a_django_connection_loads_timestamps_with_the_compiled_loader():
    connection.ensure_connection()
    loader = _loader()
    assert loader is pg_timestamps._loader_for(connection.timezone)
    # Django's per-cursor check finds its zone named and registers nothing on the cursor.
    assert loader.timezone == connection.timezone
    with connection.cursor() as cursor:
        assert cursor.cursor.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is loader


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(STAMPS, min_size=1, max_size=5))
def test_values_read_back_as_djangos_loader_reads_them(stamps):
    sql = "SELECT unnest(%s::timestamptz[]), now(), %s::timestamptz + interval '1 hour'"
    params = [stamps, stamps[0]]
    ours = _read(sql, params, djangos=False)
    theirs = _read(sql, params, djangos=True)
    assert ours == theirs
    assert [v.tzinfo for v in ours] == [v.tzinfo for v in theirs]
    assert all(v.tzinfo is connection.timezone for v in ours)
    assert ours[0] == stamps[0]


def test_a_value_python_cannot_hold_is_refused_alike():
    for sql in ("SELECT 'infinity'::timestamptz", "SELECT '0044-03-15 BC'::timestamptz"):
        for djangos in (False, True):
            with pytest.raises(DataError):
                _read(sql, [], djangos=djangos)


def test_a_session_in_another_zone_keeps_djangos_loader():
    """A connection whose session zone is not Django's (a pooler's reset, a SET TIME ZONE)
    would get another tzinfo from psycopg's loader: Django's stays."""
    connection.ensure_connection()
    raw = connection.connection
    register_tzloader(connection.timezone, raw)  # as Django's connect leaves it
    djangos = _loader()
    with connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'America/New_York'")
    try:
        use_compiled_loader(sender=None, connection=connection)
        assert _loader() is djangos
        # Django's loader still reads UTC values.
        (value,) = _read(
            "SELECT %s::timestamptz", [datetime(2026, 1, 1, tzinfo=UTC)], djangos=False
        )
        assert value.tzinfo is connection.timezone
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
    use_compiled_loader(sender=None, connection=connection)
    assert _loader() is pg_timestamps._loader_for(connection.timezone)
    (value,) = _read("SELECT now() - %s", [timedelta(days=1)], djangos=False)
    assert value.tzinfo is connection.timezone
