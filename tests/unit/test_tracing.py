"""a2a_platform/lib/tracing.py without a database: when span export is on (the OTEL_*
environment), a task's stored trace context on outgoing headers, and spans when not
exporting (none: no cost)."""

from __future__ import annotations

import pytest
from opentelemetry import propagate
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import INVALID_SPAN, get_current_span

from a2a_platform.lib import tracing

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({}, []),  # off unless an exporter is configured
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp_proto_http"]),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", "otlp_proto_http"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp_proto_http"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ["otlp_proto_http"]),
        # An endpoint with the exporter named `none`: the name wins.
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, ["otlp_proto_http"]),
    ],
)
def test_exporter_names_from_the_environment(environ, names):
    assert tracing.exporter_names(environ) == names


def test_configure_without_an_exporter_installs_nothing():
    assert tracing.configure({}) is False
    assert not tracing.exporting()


def test_configure_refuses_an_exporter_that_is_not_installed():
    with pytest.raises(RuntimeError, match="no span exporter 'zipkin'"):
        tracing.configure({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert not tracing.exporting()


def test_a_tasks_trace_goes_on_the_headers_as_stored():
    headers: dict[str, str] = {}
    tracing.inject_task_trace(headers, PARENT, "rojo=00f067aa0ba902b7")
    assert headers == {"traceparent": PARENT, "tracestate": "rojo=00f067aa0ba902b7"}


@pytest.mark.parametrize("stored", ["", "garbage", PARENT.replace("-01", "-01-extra-")])
def test_a_task_without_a_valid_trace_sends_none(stored):
    headers: dict[str, str] = {}
    tracing.inject_task_trace(headers, stored, "rojo=1")
    assert headers == {}


def test_with_propagation_off_nothing_is_sent_or_started():
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([]))
    try:
        headers: dict[str, str] = {}
        tracing.inject_task_trace(headers, PARENT)
        assert headers == {}
        assert tracing.new_task_trace() == ("", "")
        with tracing.task_span("executor run", PARENT, "", {}) as span:
            assert span is INVALID_SPAN
            assert not get_current_span().get_span_context().is_valid
    finally:
        propagate.set_global_textmap(configured)


def test_not_exporting_a_task_span_makes_the_tasks_context_current_for_log_lines():
    with tracing.task_span("executor run", PARENT, "", {}) as span:
        assert span is INVALID_SPAN  # nothing recorded
        current = get_current_span().get_span_context()
        assert format(current.trace_id, "032x") == PARENT.split("-")[1]
    assert not get_current_span().get_span_context().is_valid
    assert tracing.start_task_span("webhook delivery", PARENT, "", {}) is INVALID_SPAN
