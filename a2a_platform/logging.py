"""Log lines, in the format A2A_LOG_FORMAT picks (docs/observability.md, "Logs").

`text` (the default, for `make run` and a terminal): `KeyValueFormatter`, the message followed
by key=value pairs taken from `extra=`. `json` (for a log pipeline): `JsonFormatter`, one JSON
object per line, python-json-logger's formatter with the platform's field names.
"""

from __future__ import annotations

import json
import logging
import logging.config
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonEncoder
from pythonjsonlogger.json import JsonFormatter as _PythonJsonFormatter

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_KEYS = ("task_id", "delivery_id", "binding_version", "dispatch_id", "agent", "event_seq")


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record)} {record.levelname} {record.name} {record.getMessage()}"
        extras = {
            k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")
        }
        ordered = [k for k in _KEYS if k in extras] + sorted(k for k in extras if k not in _KEYS)
        if ordered:
            base += " " + " ".join(f"{k}={extras[k]}" for k in ordered)
        if record.exc_info:
            base += "\n" + self.formatException(record.exc_info)
        return base


# --- The process's role ----------------------------------------------------------------
WEB_SERVERS = frozenset({"uvicorn", "gunicorn", "daphne", "hypercorn"})


def process_role(argv: list[str] | None = None) -> str:
    """`web`, `worker`, `beat` or `command`, from the command line that started this process.

    Read from argv because every way of starting a component is its conventional command
    (README, `manage.py run_platform`): `celery ... worker` (its prefork children inherit the
    parent's argv), `celery ... beat`, an ASGI server (`uvicorn`, `gunicorn`, ...) or
    `manage.py runserver`; `python -m <program>` counts as <program>. Everything else
    (management commands, `celery inspect`, the test runner) is `command`."""
    argv = sys.argv if argv is None else argv
    if not argv:
        return "command"
    program = Path(argv[0]).name
    if program == "__main__.py":  # python -m celery, python -m uvicorn
        program = Path(argv[0]).parent.name
    program = program.removesuffix(".exe")
    if program == "celery":
        # The first of the two subcommands named (an app called "worker" is not expected).
        return next((arg for arg in argv[1:] if arg in ("worker", "beat")), "command")
    if program in WEB_SERVERS:
        return "web"
    if program == "manage.py" and argv[1:2] == ["runserver"]:
        return "web"
    return "command"


# --- JSON lines --------------------------------------------------------------------------
# Each record's own fields, in this order, whatever `extra=` holds.
FIXED_FIELDS = ("time", "level", "logger", "message", "role", "pid")
# `extra=` names as they come out: the rebind services log `rebind=<id>`.
RENAMED = {"rebind": "rebind_id", "exc_info": "exception", "stack_info": "stack"}
# uvicorn repeats each message with terminal colours in `color_message`.
_SKIPPED = (*RESERVED_ATTRS, "color_message")


def _encodable(value: Any) -> Any:
    """`value` if JSON can carry it as it is (after python-json-logger's own conversions:
    datetimes, dataclasses, exceptions, ...), else its repr."""
    try:
        json.dumps(value, cls=JsonEncoder, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return repr(value)
    return value


class JsonFormatter(_PythonJsonFormatter):
    """One JSON object per record: `time` (ISO 8601, UTC), `level`, `logger`, `message`,
    `role` (process_role), `pid`, then every `extra=` field (`rebind` as `rebind_id`), the
    trace's `trace_id` and `span_id` when a span is current (TraceContextFilter), and
    `exception` (the traceback) when there is one. A field JSON cannot carry comes out as its
    repr: a log line is never lost to its extras."""

    def __init__(self, *args: Any, role: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("rename_fields", RENAMED)
        kwargs.setdefault("reserved_attrs", _SKIPPED)
        # NaN and Infinity are not JSON (the standard library writes them all the same).
        kwargs.setdefault("json_serializer", _dumps_strict)
        super().__init__(*args, **kwargs)
        self.role = role or process_role()

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        fields: dict[str, Any] = {}
        super().add_fields(fields, record, message_dict)
        log_data.update(
            time=datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            level=record.levelname,
            logger=record.name,
            message=record.message,
            role=self.role,
            pid=record.process,
        )
        # A same-named extra cannot replace a record's own field.
        log_data.update((k, v) for k, v in fields.items() if k not in FIXED_FIELDS)

    def jsonify_log_record(self, log_data: dict[str, Any]) -> str:
        try:
            return super().jsonify_log_record(log_data)
        except (TypeError, ValueError, RecursionError):
            # Keys that are not strings, NaN, a cycle: only the offending fields change.
            return super().jsonify_log_record({k: _encodable(v) for k, v in log_data.items()})


def _dumps_strict(obj: Any, **kwargs: Any) -> str:
    return json.dumps(obj, allow_nan=False, **kwargs)


# --- Trace context -------------------------------------------------------------------------
class TraceContextFilter(logging.Filter):
    """Adds `trace_id` and `span_id` (W3C hex) to a record logged inside a valid OpenTelemetry
    span, when the `opentelemetry` package is installed; a record that carries its own
    (`extra=`) keeps them. Never a made-up id: outside a span, neither field is there. The
    API is looked up once, when logging is configured (its first import costs tens of ms)."""

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        try:
            from opentelemetry.trace import get_current_span
        except ImportError:
            get_current_span = None
        self._current_span = get_current_span

    def filter(self, record: logging.LogRecord) -> bool:
        if self._current_span is None or hasattr(record, "trace_id"):
            return True
        context = self._current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True


# --- Configuration --------------------------------------------------------------------------
# Loggers uvicorn configures with its own handlers (uvicorn.config.LOGGING_CONFIG) before it
# loads the app, and so before Django's logging.
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def configure(config: dict[str, Any]) -> None:
    """Django's LOGGING_CONFIG: `dictConfig(config)`, then, when the root logger writes JSON,
    Python's warnings are logged and the web server's own loggers write through the root's
    handlers too (their lines would be the server's text otherwise). A server logger it
    switched off (uvicorn's `--no-access-log`: no handler, not propagating) stays off; levels
    stay the server's."""
    logging.config.dictConfig(config)
    root = logging.getLogger()
    if not any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    # Python's warnings (a deprecation, Celery's SecurityWarning) are printed to stderr as
    # several lines of text unless they are logged.
    logging.captureWarnings(True)
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if logger.handlers:
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True
