"""Log lines (a2a_platform/logging.py): the JSON formatter's fields, the process role, the trace
context hook, and A2A_LOG_FORMAT as settings read it (a fresh interpreter each)."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from a2a_platform.logging import JsonFormatter, KeyValueFormatter, TraceContextFilter, process_role

ROOT = Path(__file__).resolve().parents[2]


def record(
    msg: str = "task moved", *args, level: int = logging.INFO, exc_info=None, **extra
) -> logging.LogRecord:
    """A record as `logging.getLogger("tasks.lifecycle").info(msg, *args, extra=extra)` makes."""
    return logging.getLogger("tasks.lifecycle").makeRecord(
        "tasks.lifecycle", level, __file__, 1, msg, args, exc_info, extra=extra
    )


def as_json(rec: logging.LogRecord, role: str = "worker") -> dict:
    line = JsonFormatter(role=role).format(rec)
    assert "\n" not in line
    return json.loads(line)


def test_json_formatter_writes_the_record_s_own_fields_first():
    task_id = str(uuid.uuid4())
    out = as_json(record("task %s moved", "t1", task_id=task_id))
    assert list(out)[:6] == ["time", "level", "logger", "message", "role", "pid"]
    assert out["level"] == "INFO"
    assert out["logger"] == "tasks.lifecycle"
    assert out["message"] == "task t1 moved"
    assert out["role"] == "worker"
    assert out["pid"] == os.getpid()
    assert out["time"].endswith("+00:00")  # ISO 8601, UTC
    assert out["task_id"] == task_id
    # Nothing of the LogRecord's own bookkeeping (args, lineno, thread, ...).
    assert set(out) == {"time", "level", "logger", "message", "role", "pid", "task_id"}


def test_json_formatter_maps_rebind_and_keeps_every_other_extra():
    out = as_json(
        record(
            "rebind.opened",
            rebind="42",
            agent="echo-agent",
            event_id=7,
            dispatch_id=3,
            binding_version=2,
            worker="worker@host",
        )
    )
    assert out["rebind_id"] == "42"
    assert "rebind" not in out
    assert out["agent"] == "echo-agent"
    assert out["event_id"] == 7
    assert out["dispatch_id"] == 3
    assert out["binding_version"] == 2
    assert out["worker"] == "worker@host"


def test_json_formatter_puts_the_traceback_in_exception():
    try:
        raise ValueError("the receiver said no")
    except ValueError:
        out = as_json(record("delivery failed", level=logging.ERROR, exc_info=sys.exc_info()))
    assert out["level"] == "ERROR"
    assert out["exception"].startswith("Traceback (most recent call last):")
    assert "ValueError: the receiver said no" in out["exception"]
    assert "exc_info" not in out


@dataclass(frozen=True)
class Claim:
    task_id: str


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"

    def __str__(self) -> str:
        return "opaque"


def test_json_formatter_keeps_extras_json_cannot_carry():
    task_id = uuid.uuid4()
    cycle: list = []
    cycle.append(cycle)
    out = as_json(
        record(
            "odd extras",
            task_id=task_id,
            claim=Claim("t1"),
            thing=Opaque(),
            raw=b"\x00bytes",
            by_pair={("a", 1): "x"},
            ratio=math.nan,
            cycle=cycle,
        )
    )
    assert out["message"] == "odd extras"
    assert out["task_id"] == str(task_id)
    assert out["claim"] == {"task_id": "t1"}
    assert out["thing"] == "opaque"
    assert isinstance(out["raw"], str)
    # Keys that are not strings, NaN and a cycle: as their repr, the line still written.
    assert out["by_pair"] == "{('a', 1): 'x'}"
    assert out["ratio"] == "nan"
    assert out["cycle"] == "[[...]]"


def test_json_formatter_does_not_let_an_extra_replace_a_record_field():
    out = as_json(record("hello", role="someone", pid="nope"))
    assert out["role"] == "worker"
    assert out["pid"] == os.getpid()


def test_json_formatter_leaves_out_uvicorn_s_coloured_copy():
    out = as_json(record("Started server process", color_message="\x1b[36mStarted\x1b[0m"))
    assert "color_message" not in out


def test_text_formatter_is_unchanged_by_the_json_mode():
    line = KeyValueFormatter().format(record("task moved", task_id="t1", agent="a", rebind="9"))
    assert line.endswith("INFO tasks.lifecycle task moved task_id=t1 agent=a rebind=9")


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["/venv/bin/celery", "-A", "a2a_platform", "worker", "-Q", "agents"], "worker"),
        (["/venv/bin/celery", "-A", "a2a_platform", "beat", "--loglevel", "INFO"], "beat"),
        (["/venv/lib/python3.11/site-packages/celery/__main__.py", "-A", "x", "beat"], "beat"),
        (["/venv/bin/celery", "-A", "a2a_platform", "inspect", "ping"], "command"),
        (["/venv/bin/uvicorn", "a2a_platform.asgi:application", "--port", "8000"], "web"),
        (["/venv/lib/python3.11/site-packages/uvicorn/__main__.py", "app"], "web"),
        (["/venv/bin/gunicorn", "-k", "uvicorn.workers.UvicornWorker"], "web"),
        (["manage.py", "runserver"], "web"),
        (["manage.py", "migrate"], "command"),
        (["/venv/bin/pytest"], "command"),
        ([], "command"),
    ],
)
def test_process_role_from_the_command_line(argv, role):
    assert process_role(argv) == role


def test_trace_context_filter_adds_ids_only_inside_a_span():
    trace = pytest.importorskip("opentelemetry.trace")
    filt = TraceContextFilter()

    outside = record("no span")
    assert filt.filter(outside) is True
    assert not hasattr(outside, "trace_id")
    assert "trace_id" not in as_json(outside)

    context = trace.SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    with trace.use_span(trace.NonRecordingSpan(context)):
        inside = record("in a span")
        filt.filter(inside)
    out = as_json(inside)
    assert out["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert out["span_id"] == "00f067aa0ba902b7"

    own = record("carried", trace_id="0af7651916cd43dd8448eb211c80319c", span_id="b7ad6b7169203331")
    with trace.use_span(trace.NonRecordingSpan(context)):
        filt.filter(own)
    assert own.trace_id == "0af7651916cd43dd8448eb211c80319c"


def run_settings(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "A2A_LOG_FORMAT"}
    environ.update({"DJANGO_SETTINGS_MODULE": "a2a_platform.settings", **env})
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unknown_log_format_is_refused_at_startup():
    result = run_settings("import django; django.setup()", A2A_LOG_FORMAT="yaml")
    assert result.returncode != 0
    assert "A2A_LOG_FORMAT must be text or json, not 'yaml'" in result.stderr


# A process as uvicorn leaves it before the app loads (its own handlers on its loggers, the
# access log switched off as --no-access-log does), then Django's setup, then one line from
# each source: the platform, uvicorn, a Python warning.
SERVER_THEN_DJANGO = """
import logging, logging.config, sys, warnings
from uvicorn.config import LOGGING_CONFIG
logging.config.dictConfig(LOGGING_CONFIG)
logging.getLogger("uvicorn.access").handlers = []
logging.getLogger("uvicorn.access").propagate = False
sys.argv = ["uvicorn", "a2a_platform.asgi:application"]
import django
django.setup()
logging.getLogger("tasks.lifecycle").warning("task created", extra={"task_id": "t1"})
logging.getLogger("uvicorn.error").info("Started server process [%d]", 1)
logging.getLogger("uvicorn.access").info("GET / 200")
warnings.warn("something is deprecated", DeprecationWarning, stacklevel=1)
"""


def test_json_mode_takes_over_the_server_s_loggers_and_python_warnings():
    result = run_settings(SERVER_THEN_DJANGO, A2A_LOG_FORMAT="json", PYTHONWARNINGS="always")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (result.stdout + result.stderr).splitlines() if line]
    by_logger = {line["logger"]: line for line in lines}
    assert by_logger["tasks.lifecycle"]["task_id"] == "t1"
    assert by_logger["uvicorn.error"]["message"] == "Started server process [1]"
    assert "something is deprecated" in by_logger["py.warnings"]["message"]
    assert "uvicorn.access" not in by_logger  # --no-access-log still holds
    assert {line["role"] for line in lines} == {"web"}


def test_text_mode_leaves_the_server_s_loggers_alone():
    result = run_settings(SERVER_THEN_DJANGO, A2A_LOG_FORMAT="text", PYTHONWARNINGS="always")
    assert result.returncode == 0, result.stderr
    assert "INFO:     Started server process [1]" in result.stderr
    assert " WARNING tasks.lifecycle task created task_id=t1" in result.stderr
