"""A client's trace across the webhook, with real processes: a live web process, a Celery
worker running the task and delivering it, and a receiver on another stack (aiohttp's server,
tests/receivers/aiohttp_receiver.py) recording what it got.

Export off (the default): the deliveries carry the client's `traceparent` (its trace id and
span) and `tracestate` as sent, and verify as a client verifies them (the headers are outside
the signature). Export on (OTEL_TRACES_EXPORTER=otlp to a small OTLP/HTTP collector this test
runs, decoding with the protocol's own protobuf classes): the task's spans (the SendMessage
request, the executor run, each delivery attempt) form one trace, the client's, linked
parent to child, and the receiver's `traceparent` names a span of it; a task opened without
one gets a trace of its own. Tasks are opened with SendMessage on the live web process."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tasks.models import Task
from tests import live
from tests.factories import AgentFactory, user_message
from tests.processes import wait_until
from tests.protocol_push import live_base_url
from tests.readiness_helpers import mark_workers_live
from tests.webhook_checks import ALLOWED, LOOPBACK_DELIVERY_MARKS, start_worker, verify, wait_all
from tests.webhook_receiver import ReceiverProcess
from webhooks.models import PushConfig

pytestmark = LOOPBACK_DELIVERY_MARKS

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


class Collector:
    """An OTLP/HTTP trace collector (POST /v1/traces, protobuf): every span it was sent."""

    def __init__(self) -> None:
        self.spans: list = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            collector.spans.extend(scope.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def of_trace(self, trace_id: str) -> list:
        with self.lock:
            return [s for s in self.spans if s.trace_id.hex() == trace_id]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    running = Collector()
    yield running
    running.stop()


def otel_env(collector: Collector, service: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def _start_web(tmp_path_factory, **env: str):
    return live.start_web(
        tmp_path_factory.mktemp("web"),
        A2A_WEBHOOK_ALLOWED_NETWORKS=ALLOWED,
        A2A_SHUTDOWN_GRACE_SECONDS="0",
        **env,
    )


@pytest.fixture(scope="module")
def plain_web(django_db_setup, tmp_path_factory):
    web = _start_web(tmp_path_factory)
    yield web
    web.stop()


@pytest.fixture(scope="module")
def traced_web(django_db_setup, tmp_path_factory, collector):
    web = _start_web(tmp_path_factory, **otel_env(collector, "a2a-web"))
    yield web
    web.stop()


@pytest.fixture
def agent(transactional_db):
    return AgentFactory(slug="traced", executor="echo")


@pytest.fixture
def receiver(tmp_path):
    """aiohttp's server, recording every request."""
    command = [sys.executable, "-m", "tests.receivers.aiohttp_receiver"]
    started = ReceiverProcess(tmp_path, name="aiohttp", command=command).start()
    yield started
    started.stop()


def send(web, agent, receiver, headers: dict[str, str], binding: str) -> tuple[Task, PushConfig]:
    """SendMessage (returnImmediately, an inline push config at the receiver) on the live web
    process over `binding`; the task and its config once every delivery is delivered."""
    mark_workers_live(web_url=web.url)
    push = {"id": "cfg-0", "url": receiver.url}
    params = {
        "message": user_message("hello"),
        "configuration": {"returnImmediately": True, "taskPushNotificationConfig": push},
    }
    base = live_base_url(web.url, agent)
    headers = {"A2A-Version": "1.0", **headers}
    if binding == "jsonrpc":
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
        got = httpx.post(base, json=body, headers=headers, timeout=15)
        task_id = got.json()["result"]["task"]["id"]
    else:
        got = httpx.post(f"{base}/message:send", json=params, headers=headers, timeout=15)
        task_id = got.json()["task"]["id"]
    config = PushConfig.objects.get(task_id=task_id)
    wait_all(config)
    return Task.objects.get(pk=task_id), config


def received_contexts(receiver, agent, task: Task) -> list:
    """The trace context of each delivery of `task` the receiver got (each verified first,
    as a client verifies it)."""
    records = [r for r in receiver.records() if r.header("x-a2a-task-id") == str(task.pk)]
    assert records
    verify(records, agent, url=receiver.url)
    out = []
    for record in records:
        carrier = {"traceparent": record.header("traceparent") or ""}
        if record.header("tracestate") is not None:
            carrier["tracestate"] = record.header("tracestate")
        out.append(get_current_span(TraceContextTextMapPropagator().extract(carrier)))
    return [span.get_span_context() for span in out]


@pytest.mark.parametrize("binding", ["jsonrpc", "http_json"])
def test_the_clients_trace_reaches_the_receiver_with_export_off(
    plain_web, procs, agent, receiver, binding
):
    start_worker(procs)
    task, _ = send(
        plain_web, agent, receiver, {"traceparent": PARENT, "tracestate": STATE}, binding
    )
    contexts = received_contexts(receiver, agent, task)
    assert len(contexts) >= 3  # the snapshot, working, completed
    for context in contexts:
        assert context.is_valid
        # Propagation only: the client's span is the parent the deliveries name.
        assert format(context.trace_id, "032x") == TRACE_ID
        assert format(context.span_id, "016x") == CLIENT_SPAN
        assert context.trace_flags.sampled
        assert context.trace_state.to_header() == STATE


def test_without_a_traceparent_each_tasks_deliveries_carry_its_own_trace(
    plain_web, procs, agent, receiver
):
    start_worker(procs)
    first, _ = send(plain_web, agent, receiver, {}, "jsonrpc")
    second, _ = send(plain_web, agent, receiver, {}, "jsonrpc")
    traces = []
    for task in (first, second):
        contexts = received_contexts(receiver, agent, task)
        assert {format(c.trace_id, "032x") for c in contexts} == {task.traceparent.split("-")[1]}
        traces.append(contexts[0].trace_id)
    assert traces[0] != traces[1]


def spans_by_name(spans) -> dict[str, list]:
    out: dict[str, list] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def test_with_export_on_the_tasks_spans_form_the_clients_trace(
    traced_web, procs, collector, agent, receiver
):
    # The lifecycle's log lines (A2A_TASK_LOG_LEVEL) are written inside the executor's run.
    worker = start_worker(procs, A2A_TASK_LOG_LEVEL="INFO", **otel_env(collector, "a2a-worker"))
    task, config = send(
        traced_web, agent, receiver, {"traceparent": PARENT, "tracestate": STATE}, "jsonrpc"
    )
    deliveries = config.deliveries.count()
    # Exported in batches: wait for the request's, the run's and every attempt's span.
    wanted = {"A2A SendMessage": 1, "executor run": 1, "webhook delivery": deliveries}

    def complete():
        named = spans_by_name(collector.of_trace(TRACE_ID))
        return all(len(named.get(n, [])) >= k for n, k in wanted.items()) and named

    named = wait_until(complete, timeout=30, message="the task's spans exported")
    (request,) = named["A2A SendMessage"]
    assert request.parent_span_id.hex() == CLIENT_SPAN
    assert request.trace_state == STATE
    # The task stored the request's span: its work is the request's child.
    assert task.traceparent == f"00-{TRACE_ID}-{request.span_id.hex()}-01"
    (run,) = named["executor run"]
    assert run.parent_span_id == request.span_id
    attempts = named["webhook delivery"]
    assert {a.parent_span_id for a in attempts} == {request.span_id}
    for attempt in attempts:
        attributes = {a.key: a.value for a in attempt.attributes}
        assert attributes["http.response.status_code"].int_value == 200
        assert attributes["a2a.delivery.attempt"].int_value == 1
        assert attributes["a2a.binding_version"].string_value == "cfg-0.v1"
    # Each delivery names a span of this trace under its attempt (the HTTP client's).
    spans = {s.span_id: s for s in collector.of_trace(TRACE_ID)}
    attempt_ids = {a.span_id for a in attempts}
    for context in received_contexts(receiver, agent, task):
        assert format(context.trace_id, "032x") == TRACE_ID
        assert context.trace_state.to_header() == STATE
        sent_as = context.span_id.to_bytes(8, "big")
        wait_until(
            lambda sent_as=sent_as: (
                sent_as in spans
                or spans.update({s.span_id: s for s in collector.of_trace(TRACE_ID)})
            ),
            timeout=10,
            message="the delivery's client span exported",
        )
        assert sent_as in attempt_ids or spans[sent_as].parent_span_id in attempt_ids
    # Log lines inside the run carry the trace's ids.
    lines = [
        line
        for line in worker.log().splitlines()
        if "tasks.lifecycle" in line
        and str(task.pk) in line
        and "dispatch claimed" not in line  # the claim's, before the run
    ]
    assert lines
    assert all(f"trace_id={TRACE_ID}" in line for line in lines), lines

    # Without a traceparent: a trace of the task's own, the request its root.
    other, _ = send(traced_web, agent, receiver, {}, "http_json")
    own = other.traceparent.split("-")[1]
    assert own != TRACE_ID
    named = wait_until(
        lambda: (n := spans_by_name(collector.of_trace(own))) and "executor run" in n and n,
        timeout=30,
        message="the second task's spans exported",
    )
    (request,) = named["A2A SendMessage"]
    assert request.parent_span_id == b""
    assert named["executor run"][0].parent_span_id == request.span_id
