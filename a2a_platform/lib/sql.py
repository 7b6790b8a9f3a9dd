"""Prepared raw SQL on Django's connection, for the few hot statements where the ORM's query
building (and PostgreSQL planning an unprepared statement each time) costs more than the work.

Used by tasks/task_store/ and webhooks/delivery/outbox_store/ on PostgreSQL only; both keep an ORM
twin for the embedded SQLite database.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection, models
from django.db.models import signals
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForwardManyToOneDescriptor
from django.db.models.query_utils import DeferredAttribute

from a2a_platform.lib.json_bytes import dumps

M = TypeVar("M", bound=models.Model)


def run_prepared(sql: str, params: dict) -> list[tuple]:
    """Run one statement as a prepared statement (server-side binding) on Django's
    connection, in its current transaction; its rows (none for a write without RETURNING).
    Database errors surface as Django's, and the connection's execute wrappers
    (`connection.execute_wrapper`) see the statement as they see the ORM's."""
    import psycopg

    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:

        def execute(sql: str, params: dict, many: bool, context: dict) -> None:
            cursor.execute(sql, params, prepare=True)

        for wrapper in reversed(connection.execute_wrappers):  # the first one outermost
            execute = functools.partial(wrapper, execute)
        execute(sql, params, False, {"connection": connection, "cursor": cursor})
        # Not `cursor.description`: it builds a Column object per column, per statement.
        returned = cursor.pgresult.status == psycopg.pq.ExecStatus.TUPLES_OK
        return cursor.fetchall() if returned else []


def json_rows(model: type[models.Model], objs: Iterable[models.Model]):
    """New rows of `model` as one JSON parameter, an array of objects keyed by column (for
    `jsonb_populate_recordset(NULL::<table>, %(…)s)`, `insert_json_rows`): the values each
    field would save (`pre_save` fills auto_now stamps, as `save()` would), serialised in one
    call. In place of a parameter per column, each value prepared by its field and dumped by
    psycopg's Python: 13 against 170 µs for a new task's four rows (docs/decisions.md,
    "Prepared statements and rows").

    Only for fields whose saved value is the attribute's own value as JSON (`_JSON_SAVED`,
    checked once per model): timestamps and UUIDs are written as ISO 8601 and hex text, which
    PostgreSQL reads back exactly; a JSON field's value is embedded as JSON. Written by
    `lib/json_bytes.dumps` (orjson, the standard library for an integer past 64 bits)."""
    fields = _json_saved_fields(model)
    return json_param([{f.column: f.pre_save(obj, True) for f in fields} for obj in objs])


def json_param(value: object):
    """`value` as one jsonb parameter, dumped by `lib/json_bytes.dumps` (timestamps as ISO
    8601, UUIDs as text, as `json_rows` writes them)."""
    from psycopg.types.json import Jsonb

    return Jsonb(value, dumps=dumps)


def insert_json_rows(model: type[models.Model], param: str) -> str:
    """`INSERT INTO <table> (<columns>) SELECT <columns> FROM <rows> v`, the rows those of
    `json_rows(model, …)` passed as %(param)s; the caller appends a WHERE or an ORDER BY on
    `v`."""
    table = model._meta.db_table
    cols = ", ".join(f.column for f in _json_saved_fields(model))
    return (
        f"INSERT INTO {table} ({cols}) SELECT {cols} "
        f"FROM jsonb_populate_recordset(NULL::{table}, %({param})s) v"
    )


# Fields whose `get_db_prep_save` of a value is that value, as JSON text reads it back.
_JSON_SAVED = (
    models.UUIDField,
    models.CharField,
    models.TextField,
    models.DateTimeField,
    models.BooleanField,
    models.IntegerField,
    models.JSONField,
    models.ForeignKey,
)


@functools.cache
def _json_saved_fields(model: type[models.Model]) -> tuple[models.Field, ...]:
    """The columns an INSERT names (every concrete field but a database-generated key), each
    checked to save its value as JSON reads it back."""
    fields = tuple(f for f in model._meta.concrete_fields if not isinstance(f, models.AutoField))
    for f in fields:
        kind = f.target_field if isinstance(f, models.ForeignKey) else f
        plain = isinstance(kind, _JSON_SAVED) and getattr(kind, "encoder", None) is None
        if not plain:
            raise TypeError(f"{model.__name__}.{f.name}: its saved value is not its JSON")
    return fields


def columns(model: type[models.Model], alias: str) -> str:
    """`alias.col, ...` for every concrete field of `model`, in `from_row`'s order."""
    return ", ".join(f"{alias}.{f.column}" for f in model._meta.concrete_fields)


def from_row(model: type[M], values: tuple) -> M:
    """A model instance from the values of `columns(model, ...)`, converted as the ORM would
    (JSON columns arrive as text on Django's connection: its loader leaves them to the field)."""
    attnames, db_fields, _ = _layout(model)
    converted = [
        value if f is None else f.from_db_value(value, None, connection)
        for f, value in zip(db_fields, values, strict=True)
    ]
    return _loaded(model, connection.alias, attnames, converted)


def from_json_rows(model: type[M], rows: object) -> list[M]:
    """Model instances from a `json_agg(json_build_array(columns(model, ...)))` value (text,
    or None for no rows): JSON columns are already values, timestamps and UUIDs are parsed
    back from their JSON text."""
    if rows is None:
        return []
    if isinstance(rows, str):
        rows = json.loads(rows)
    attnames, _, parsers = _layout(model)
    # Once, not per row: each lookup through Django's connection proxy finds this thread's
    # connection again (docs/perf-log.md, "The reads of one turn made together").
    alias = connection.alias
    return [
        _loaded(
            model,
            alias,
            attnames,
            [
                value if parse is None or value is None else parse(value)
                for parse, value in zip(parsers, values, strict=True)
            ],
        )
        for values in rows
    ]


def _loaded(model: type[M], alias: str, attnames: list[str], values: list) -> M:
    """`model.from_db` for a row of every concrete field, without `Model.__init__`: the
    instance Django would load (its fields' values, `_state` of a row read from `alias`),
    in a fifth of the time (1.1 against 5.8 µs for a task row; docs/decisions.md, "Prepared
    statements and rows"). Once any `pre_init`/`post_init` receiver is connected (none is
    today), every row goes through `from_db`, so receivers run as they would."""
    if signals.pre_init.receivers or signals.post_init.receivers:
        return model.from_db(alias, attnames, values)
    instance = model.__new__(model)
    instance.__dict__.update(zip(attnames, values, strict=True))
    state = instance._state = ModelState()
    state.adding = False
    state.db = alias
    return instance


def new_row(model: type[M], **values: Any) -> M:
    """`model(**values)` for a row about to be inserted, without `Model.__init__`'s generic
    walk: each field's value from `values` (by attname, or a foreign key by name: the related
    object, set through Django's own descriptor), else its default, as Django's constructor
    sets them, in about half the time (docs/decisions.md, "Prepared statements and
    rows"). Only for models whose every field is a plain column or a many-to-one key
    (`_new_row_fields`: TypeError otherwise); a name that is no field raises TypeError, as
    the constructor does. With any `pre_init`/`post_init` receiver connected, the
    constructor itself runs."""
    if signals.pre_init.receivers or signals.post_init.receivers:
        return model(**values)
    instance = model.__new__(model)
    attrs = instance.__dict__
    attrs["_state"] = ModelState()
    used = 0
    for name, attname, descriptor, field in _new_row_fields(model):
        if descriptor is not None and name in values:
            descriptor.__set__(instance, values[name])
        elif attname in values:
            attrs[attname] = values[attname]
        else:
            attrs[attname] = field.get_default()
            continue
        used += 1
    if used != len(values):
        known = {n for row in _new_row_fields(model) for n in row[:2]}
        unknown = ", ".join(sorted(set(values) - known)) or "a field given twice"
        raise TypeError(f"{model.__name__} has no field named {unknown}")
    return instance


@functools.cache
def _new_row_fields(model: type[models.Model]) -> tuple[tuple, ...]:
    """Per model: (name, attname, the foreign key's descriptor or None, field) for each
    field, after checking that `new_row` builds it as the constructor does (each value in
    the instance's dict, no descriptor of its own but a many-to-one key's)."""
    rows = []
    for field in model._meta.fields:
        attribute = getattr(model, field.attname, None)
        if field.many_to_one and type(getattr(model, field.name)) is ForwardManyToOneDescriptor:
            rows.append((field.name, field.attname, getattr(model, field.name), field))
        elif (
            field.concrete
            and not field.is_relation
            and not getattr(field, "generated", False)
            and type(attribute) is DeferredAttribute
        ):
            rows.append((field.name, field.attname, None, field))
        else:
            raise TypeError(f"new_row cannot build {model.__name__}.{field.name}")
    return tuple(rows)


@functools.cache
def _layout(model: type[models.Model]) -> tuple[list[str], tuple, tuple]:
    """Per model, worked out once (per row it cost more than the conversions): the concrete
    fields' attnames, in `columns`' order; each field that converts a database value
    (`from_db_value`), else None; and how each field's value is read back from JSON text
    (timestamps and UUIDs), else None."""
    fields = model._meta.concrete_fields
    db_fields = tuple(f if hasattr(f, "from_db_value") else None for f in fields)
    return [f.attname for f in fields], db_fields, tuple(_json_parser(f) for f in fields)


def _json_parser(field: models.Field) -> Callable[[Any], Any] | None:
    kind = (field.target_field if field.is_relation else field).get_internal_type()
    if kind == "DateTimeField":
        return datetime.fromisoformat
    if kind == "UUIDField":
        return uuid.UUID
    return None
