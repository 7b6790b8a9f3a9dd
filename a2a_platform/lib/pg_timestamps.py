"""Timestamps read from PostgreSQL by psycopg's compiled loader, not Django's Python one.

Django registers its own `timestamptz` loader on every PostgreSQL connection
(`django/db/backends/postgresql/psycopg_any.py`, `BaseTzLoader`): it subclasses psycopg's
pure-Python loader to put Django's time zone on each value, so every timestamp a query
returns is parsed in Python even when psycopg's C implementation is installed: about 8 µs a
value against 1 µs (docs/decisions.md, "Prepared statements and rows"). A claimed task row
alone carries five.

When the connection's session time zone is Django's own (Django sets it so on connect:
`TIME_ZONE`, UTC here), psycopg's default loader already returns exactly what Django's
does, the same instant with the same `tzinfo` object, so `use_compiled_loader` registers
that loader on the connection instead. The registered class keeps Django's `timezone`
attribute, so Django's per-cursor check (`create_cursor`: re-register when the
connection's loader names another zone) still passes and copies nothing. A connection
whose session zone differs (a pooler that resets it, a `SET TIME ZONE`) keeps Django's
loader; `USE_TZ = False` too.
"""

from __future__ import annotations

import psycopg
from django.db.backends.signals import connection_created
from psycopg.adapt import Loader
from psycopg.pq import Format

TIMESTAMPTZ_OID = psycopg.adapters.types["timestamptz"].oid
# psycopg's own text loader: the C one when psycopg's binary or C implementation is
# installed (requirements.txt: psycopg[binary]), else its Python one.
_DEFAULT_LOADER = psycopg.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)

_loaders: dict[object, type[Loader]] = {}


def _loader_for(tz) -> type[Loader]:
    """A loader class naming Django's zone `tz` (for Django's check) whose instances load
    with psycopg's default loader. The compiled loader class cannot be subclassed, so each
    instance holds one and answers `load` with its bound method: psycopg's row loop calls it
    without a Python frame of ours."""
    cls = _loaders.get(tz)
    if cls is None:

        class CompiledTimestamptzLoader(Loader):
            timezone = tz

            # Each instance's own, set in __init__ (Loader's abstract `load` is met here).
            load = None

            def __init__(self, oid: int, context=None) -> None:
                super().__init__(oid, context)
                self.load = _DEFAULT_LOADER(oid, context).load

        cls = _loaders[tz] = CompiledTimestamptzLoader
    return cls


def use_compiled_loader(sender, connection, **kwargs) -> None:
    """`connection_created` receiver (each Django connect, a pool's lend included): on a
    PostgreSQL connection whose session zone is Django's, timestamps load with psycopg's
    default loader. Once per physical connection: its adapters keep the registration."""
    if connection.vendor != "postgresql" or connection.timezone is None:
        return
    raw = connection.connection
    adapters = raw.adapters
    loader = _loader_for(connection.timezone)
    if adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is loader:
        return
    if raw.info.timezone != connection.timezone:
        return
    adapters.register_loader("timestamptz", loader)


def install() -> None:
    connection_created.connect(
        use_compiled_loader, weak=False, dispatch_uid="a2a_platform.lib.pg_timestamps"
    )
