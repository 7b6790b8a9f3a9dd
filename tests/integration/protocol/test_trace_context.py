"""W3C trace context on SendMessage (a2a_platform/lib/tracing.py), span export off as by
default: a caller's `traceparent` (and `tracestate`) on either binding is stored with the new
task, which its executor runs and webhook deliveries continue; without one the task gets a
fresh trace of its own; a malformed one is ignored, never an error; OTEL_PROPAGATORS=none
stores nothing. The real processes and a receiver on another stack:
tests/integration/webhooks/test_trace_context.py."""

from __future__ import annotations

import pytest
from opentelemetry import propagate
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from a2a_platform.asgi import application
from tasks.models import Task
from tests.factories import AgentFactory, user_message
from tests.integration.protocol.test_streaming import db, run, until_db
from tests.sse import ASGIStream, streams_reset

V1 = {"A2A-Version": "1.0"}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


@pytest.fixture
def agent(transactional_db):
    return AgentFactory(slug="traced", is_default=True, executor="external")


def send_jsonrpc(wire, headers: dict[str, str]) -> Task:
    params = {"message": user_message("hi"), "configuration": {"returnImmediately": True}}
    answer = wire.rpc("SendMessage", params, headers={**V1, **headers})
    assert "result" in answer, answer
    return Task.objects.get(pk=answer["result"]["task"]["id"])


def send_http_json(wire, headers: dict[str, str]) -> Task:
    body = {"message": user_message("hi"), "configuration": {"returnImmediately": True}}
    got = wire.request("POST", "/message:send", json=body, headers={**V1, **headers})
    assert got.status_code == 200, got.text
    return Task.objects.get(pk=got.json()["task"]["id"])


BINDINGS = [
    pytest.param(send_jsonrpc, id="jsonrpc"),
    pytest.param(send_http_json, id="http_json"),
]


def parsed(task: Task):
    """The task's stored context, read back by the W3C propagator."""
    carrier = {"traceparent": task.traceparent, "tracestate": task.tracestate}
    return get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()


@pytest.mark.parametrize("send", BINDINGS)
def test_send_message_stores_the_callers_traceparent_and_tracestate(wire, agent, send):
    task = send(wire, {"traceparent": PARENT, "tracestate": STATE})
    # Not exporting, the caller's span is the parent the task's work names.
    assert task.traceparent == PARENT
    assert task.tracestate == STATE
    assert format(parsed(task).trace_id, "032x") == TRACE_ID


@pytest.mark.parametrize("send", BINDINGS)
def test_send_message_without_traceparent_starts_a_trace_per_task(wire, agent, send):
    first, second = send(wire, {}), send(wire, {})
    for task in (first, second):
        context = parsed(task)
        assert context.is_valid, task.traceparent
        assert context.trace_flags.sampled
        assert task.tracestate == ""
    assert parsed(first).trace_id != parsed(second).trace_id


@pytest.mark.parametrize(
    "malformed",
    [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
        f"00-{TRACE_ID}-0000000000000000-01",  # an all-zero parent id
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # version ff is invalid
        "not a traceparent",
        f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",  # upper-case hex
    ],
)
@pytest.mark.parametrize("send", BINDINGS)
def test_a_malformed_traceparent_is_ignored(wire, agent, send, malformed):
    task = send(wire, {"traceparent": malformed, "tracestate": STATE})
    context = parsed(task)
    assert context.is_valid
    assert format(context.trace_id, "032x") != TRACE_ID
    assert task.tracestate == ""  # a tracestate without its traceparent goes with it


def test_a_follow_up_keeps_the_tasks_trace(wire, agent):
    task = send_jsonrpc(wire, {"traceparent": PARENT})
    other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    message = user_message("more", taskId=str(task.pk), contextId=task.context_id)
    answer = wire.rpc(
        "SendMessage",
        {"message": message, "configuration": {"returnImmediately": True}},
        headers={**V1, "traceparent": other},
    )
    assert "result" in answer, answer
    task.refresh_from_db()
    assert task.traceparent == PARENT


def test_with_propagation_off_nothing_is_stored(wire, agent):
    """OTEL_PROPAGATORS=none: the global propagator carries nothing, and the platform
    neither reads, invents nor sends a trace context."""
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(CompositePropagator([]))
    try:
        task = send_jsonrpc(wire, {"traceparent": PARENT})
    finally:
        propagate.set_global_textmap(configured)
    assert (task.traceparent, task.tracestate) == ("", "")


@pytest.mark.parametrize("binding", ["jsonrpc", "rest"])
def test_send_streaming_message_stores_the_callers_trace(wire, agent, binding):
    params = {"message": user_message("stream me")}
    headers = {**V1, "traceparent": PARENT, "tracestate": STATE}

    async def scenario() -> Task:
        if binding == "jsonrpc":
            body = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": params}
            stream = ASGIStream(application, "POST", "/", json_body=body, headers=headers)
        else:
            stream = ASGIStream(
                application, "POST", "/message:stream", json_body=params, headers=headers
            )
        await stream.open()
        assert stream.is_stream
        await until_db(lambda: Task.objects.exists())
        await stream.disconnect()
        return await db(lambda: Task.objects.get())

    streams_reset()
    task = run(scenario)
    assert (task.traceparent, task.tracestate) == (PARENT, STATE)
