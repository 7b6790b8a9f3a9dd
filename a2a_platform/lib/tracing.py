"""Traces: OpenTelemetry spans when `OTEL_*` configures an exporter, W3C trace context always.

Two switches, both the OpenTelemetry SDK's standard environment (docs/observability.md,
"Traces"):

- **Export** (`exporting()`): on when `OTEL_TRACES_EXPORTER` names an exporter (or an OTLP
  endpoint is set with no exporter named) and `OTEL_SDK_DISABLED` is not `true`. `configure()`
  then installs the SDK's tracer provider (resource from `OTEL_SERVICE_NAME` and
  `OTEL_RESOURCE_ATTRIBUTES`, sampler from `OTEL_TRACES_SAMPLER`, batching from `OTEL_BSP_*`)
  and the Django, Celery, psycopg and aiohttp-client instrumentations. Off, neither is set up
  or imported (the SDK's id generator aside) and every helper here returns before creating
  a span.
- **Propagation** (`propagating()`): on while the global propagator (`OTEL_PROPAGATORS`, the
  API's own handling; `tracecontext,baggage` by default) carries `traceparent`. A new task
  stores its W3C trace context (`Task.traceparent`, `Task.tracestate`): the caller's on
  SendMessage, else a fresh trace. Its executor runs and webhook deliveries continue it, in any
  process and after any restart, exported or not. `OTEL_PROPAGATORS=none` turns it off.

Headers are parsed and written by the API's propagators only (`TraceContextTextMapPropagator`
for what is stored, the global one at the HTTP edges): a malformed `traceparent` is ignored,
as W3C Trace Context (section 4.3) asks, never an error.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Awaitable, Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

# The SDK's id generator makes a task's own trace when the caller sent none, export or not:
# imported with this module (the SDK's trace package, some 40 ms once at start), not by the
# first SendMessage.
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# What a task stores is W3C Trace Context whatever OTEL_PROPAGATORS says on the wire.
_W3C = TraceContextTextMapPropagator()
# A proxy: it follows the provider `configure()` installs, and is a no-op tracer before.
_tracer = trace.get_tracer("a2a_platform")
_ids = RandomIdGenerator()
_exporting = False
# `otlp` is OTLP over HTTP/protobuf: the one OTLP exporter installed (requirements.txt).
_EXPORTER_ALIASES = {"otlp": "otlp_proto_http"}


def exporting() -> bool:
    """Spans are recorded and exported (`configure()` found an exporter)."""
    return _exporting


def propagating() -> bool:
    """The global propagator (OTEL_PROPAGATORS) carries W3C `traceparent`."""
    return _carries_traceparent(propagate.get_global_textmap())


@functools.lru_cache(maxsize=8)
def _carries_traceparent(propagator: Any) -> bool:
    # Per propagator object (a composite builds its `fields` set on each call): a test's or an
    # operator's `set_global_textmap` is another object.
    return "traceparent" in propagator.fields


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The span exporters the environment asks for (entry point names); [] when export is
    off: no exporter named (or `none`), or the SDK disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",")]
    names = [n for n in names if n]
    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if not names and endpoint:
        names = ["otlp"]
    if "none" in names:
        return []
    return [_EXPORTER_ALIASES.get(n, n) for n in names]


def configure(environ: Mapping[str, str] | None = None) -> bool:
    """Turn span export on when the environment configures an exporter (once per process;
    True when on). Called at process start, before Django loads its middleware and before
    any aiohttp session or database connection exists, so the instrumentations see them all.
    An exporter name that is not installed raises: a misconfiguration is loud at start."""
    global _exporting
    environ = os.environ if environ is None else environ
    names = exporter_names(environ)
    if _exporting or not names:
        return _exporting
    from importlib.metadata import entry_points

    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    provider = TracerProvider(
        resource=Resource.create({} if named else {SERVICE_NAME: "a2a-platform"})
    )
    for name in names:
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            raise RuntimeError(f"OTEL_TRACES_EXPORTER: no span exporter {name!r} is installed")
        # A batch per exporter: spans leave on the SDK's thread, never on a request's.
        provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
    trace.set_tracer_provider(provider)
    _instrument()
    _exporting = True
    return True


def _instrument() -> None:
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()
    PsycopgInstrumentor().instrument()
    AioHttpClientInstrumentor().instrument()


# --- A task's trace context ------------------------------------------------------------------


def _as_context(span_context: SpanContext) -> otel_context.Context:
    return trace.set_span_in_context(NonRecordingSpan(span_context))


def new_task_trace() -> tuple[str, str]:
    """The (traceparent, tracestate) a new task stores: the current span's (the SendMessage
    request's, a child of the caller's `traceparent`; or, not exporting, the caller's own), else
    a fresh sampled trace of the platform's. ("", "") when propagation is off."""
    if not propagating():
        return "", ""
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        span_context = SpanContext(
            trace_id=_ids.generate_trace_id(),
            span_id=_ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=_as_context(span_context))
    return carrier.get("traceparent", ""), carrier.get("tracestate", "")


# A task's deliveries and runs parse the same stored context again and again (each attempt of
# each event): parsed once per process while it is recent. A Context is immutable.
@functools.lru_cache(maxsize=4096)
def task_context(traceparent: str, tracestate: str = "") -> otel_context.Context | None:
    """A stored trace context as an OpenTelemetry context (its span the remote parent); None
    when there is none (or it does not parse)."""
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = _W3C.extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def inject_task_trace(headers: dict[str, str], traceparent: str, tracestate: str = "") -> None:
    """Add a task's stored trace context to outgoing `headers` through the global propagator
    (nothing when propagation is off or the task has none)."""
    if traceparent:
        headers.update(_task_headers(traceparent, tracestate, propagate.get_global_textmap()))


@functools.lru_cache(maxsize=4096)
def _task_headers(traceparent: str, tracestate: str, propagator: Any) -> dict[str, str]:
    """What the propagator writes for a stored context (cached per propagator: a test or an
    operator's `set_global_textmap` changes it)."""
    context = task_context(traceparent, tracestate)
    carrier: dict[str, str] = {}
    if context is not None and "traceparent" in propagator.fields:
        propagator.inject(carrier, context=context)
    return carrier


# --- Spans -----------------------------------------------------------------------------------


@contextlib.contextmanager
def server_request(
    headers: Mapping[str, str], name: str, attributes: dict[str, Any]
) -> Iterator[Span]:
    """A protocol request: a SERVER span, the child of the caller's `traceparent` when it
    carries a valid one. Not exporting, the caller's context is made current all the same (no
    span), so a task it opens continues the caller's trace (`new_task_trace`)."""
    if not _exporting:
        # Only W3C trace context is kept (a task stores no baggage): no header, nothing to read.
        if "traceparent" not in headers or not propagating():
            yield INVALID_SPAN
            return
        parent = propagate.extract(headers)
        token = otel_context.attach(parent)
        try:
            yield trace.get_current_span(parent)
        finally:
            otel_context.detach(token)
        return
    with _tracer.start_as_current_span(
        name, context=propagate.extract(headers), kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        yield span


def start_task_span(
    name: str,
    traceparent: str,
    tracestate: str,
    attributes: dict[str, Any],
    *,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Span:
    """A span of a task's work, started (not made current): the child of the task's stored
    context, linked to the span current here (the Celery job's, which may serve many tasks).
    INVALID_SPAN when not exporting. The caller ends it."""
    if not _exporting:
        return INVALID_SPAN
    current = trace.get_current_span().get_span_context()
    links = [Link(current)] if current.is_valid else None
    parent = task_context(traceparent, tracestate) or otel_context.Context()
    return _tracer.start_span(name, context=parent, kind=kind, attributes=attributes, links=links)


@contextlib.contextmanager
def task_span(
    name: str, traceparent: str, tracestate: str, attributes: dict[str, Any]
) -> Iterator[Span]:
    """`start_task_span`, current within the block (log lines carry its ids), ended after
    it; an exception escaping the block is recorded on it. Not exporting, the task's stored
    context is current instead (log lines carry the task's trace id), when propagating."""
    if not _exporting:
        context = task_context(traceparent, tracestate) if propagating() else None
        if context is None:
            yield INVALID_SPAN
            return
        token = otel_context.attach(context)
        try:
            yield INVALID_SPAN
        finally:
            otel_context.detach(token)
        return
    span = start_task_span(name, traceparent, tracestate, attributes)
    with trace.use_span(span, end_on_exit=True):
        yield span


def span_context_of(span: Span) -> otel_context.Context | None:
    """The context that makes `span` the parent (None for INVALID_SPAN)."""
    return trace.set_span_in_context(span) if span.get_span_context().is_valid else None


def name_operation(operation: str) -> None:
    """The current protocol request's span named after the A2A operation it turned out to be
    (a JSON-RPC method): `A2A SendMessage`, `rpc.method`. Nothing when not exporting."""
    if _exporting:
        span = trace.get_current_span()
        span.update_name(f"A2A {operation}")
        span.set_attribute("rpc.method", operation)


def headers_for_span(headers: dict[str, str], span: Span) -> dict[str, str]:
    """`headers` naming `span` as the trace parent (a copy; `headers` as they are when `span`
    is INVALID_SPAN)."""
    if not span.get_span_context().is_valid:
        return headers
    named = dict(headers)
    propagate.inject(named, context=trace.set_span_in_context(span))
    return named


def end_http_span(span: Span, status: int | None, error: str | None, *, ok: bool) -> None:
    """End an HTTP attempt's span with its answer: `http.response.status_code`, `error.type`
    (the transport's error class, or the status) and an ERROR status when it failed."""
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    if not ok:
        span.set_attribute("error.type", error or str(status))
        span.set_status(Status(StatusCode.ERROR))
    span.end()


async def within_context(context: otel_context.Context, awaitable: Awaitable[Any]) -> Any:
    """Await `awaitable` with `context` current (a coroutine run on another thread's loop)."""
    token = otel_context.attach(context)
    try:
        return await awaitable
    finally:
        otel_context.detach(token)
