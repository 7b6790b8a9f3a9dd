"""The receiver matrix: real webhook receivers on the stacks our clients run, each a process of
its own (tests/receivers/), and a real worker delivering to them.

Our own receiver (tests/webhook_receiver.py) tolerates what the stacks clients run may not: a
client's aiohttp receiver got no notification at all because every delivery carried
`User-Agent` twice, which aiohttp's server answers 400. So each stack here gets a task's
deliveries and every record is verified as a client verifies it (tests.webhook_checks): every
event, in order, each received once, with each header once on the wire (where the stack hands
over the header list as sent). The answers are the ones these stacks give (chosen by the
registered URL's path, tests/receivers/answers.py): chunked, `Connection: close`, HTTP/1.0
(closed after each answer, or a body that ends at the close), a slow body, 410 Gone and a 302
(final: dead-lettered after one try, and the redirect never followed).

One worker (tests.webhook_checks.start_worker) and one process per stack serve the whole
module; each test's task, deliveries and records are its own (records are matched by the
deliveries' ids).
"""

from __future__ import annotations

import socket
import sys
from collections import Counter
from dataclasses import dataclass

import h11
import pytest

from tasks.models import Task
from tasks.states import TERMINAL_STATES
from tests.processes import ROOT, wait_until
from tests.receivers import answers
from tests.webhook_checks import (
    assert_delivered,
    deliveries,
    open_task,
    owed_seqs,
    start_worker,
    verify,
)
from tests.webhook_receiver import HOST, ReceiverProcess, Record
from webhooks.models import DeliveryAttempt, DeliveryState, PushConfig

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]


@dataclass(frozen=True)
class Stack:
    command: tuple[str, ...]
    # Does the stack hand the app the header list as sent (duplicates kept)? WSGI servers
    # join a repeated header's values with "," into one environ key instead.
    raw_headers: bool
    http_version: bytes = b"1.1"  # what it answers with


PY = sys.executable
STACKS = {
    "aiohttp": Stack((PY, "-m", "tests.receivers.aiohttp_receiver"), raw_headers=True),
    "uvicorn-starlette": Stack((PY, "-m", "tests.receivers.starlette_receiver"), raw_headers=True),
    "gunicorn-sync": Stack((PY, "-m", "tests.receivers.gunicorn_receiver"), raw_headers=False),
    "werkzeug": Stack((PY, "-m", "tests.receivers.werkzeug_receiver"), raw_headers=False),
    "http.server-1.0": Stack(
        (PY, "-m", "tests.receivers.http10_receiver"), raw_headers=True, http_version=b"1.0"
    ),
    "node": Stack(("node", str(ROOT / "tests/receivers/node_receiver.js")), raw_headers=True),
}

# (stack, path) the receiver accepts: every delivery must arrive. gunicorn's sync worker
# closes after every answer (`Connection: close` on each), http.server-1.0 on HTTP/1.0.
DELIVERED = [
    ("aiohttp", "/hook"),
    ("aiohttp", "/chunked"),
    ("aiohttp", "/slow"),
    ("uvicorn-starlette", "/hook"),
    ("uvicorn-starlette", "/chunked"),
    ("uvicorn-starlette", "/close"),
    ("gunicorn-sync", "/hook"),
    ("gunicorn-sync", "/chunked"),
    ("werkzeug", "/hook"),
    ("werkzeug", "/close"),
    ("http.server-1.0", "/hook"),
    ("http.server-1.0", "/eof"),
    ("http.server-1.0", "/slow"),
    ("node", "/hook"),
    ("node", "/chunked"),
    ("node", "/slow"),
    ("node", "/close"),
]
# (stack, path) answered with a final refusal: each delivery dead-lettered after one try.
FINAL = [
    ("aiohttp", "/gone"),
    ("gunicorn-sync", "/gone"),
    ("http.server-1.0", "/gone"),
    ("node", "/gone"),
    ("uvicorn-starlette", "/redirect"),
    ("werkzeug", "/redirect"),
    ("http.server-1.0", "/redirect"),
    ("node", "/redirect"),
]


def cases(pairs: list[tuple[str, str]]) -> list:
    return [pytest.param(stack, path, id=f"{stack}{path}") for stack, path in pairs]


@pytest.fixture(scope="module")
def stacks(tmp_path_factory):
    """One receiver process per stack for the module, started when a test first needs it."""
    log_dir = tmp_path_factory.mktemp("receivers")
    started: dict[str, ReceiverProcess] = {}

    def get(name: str) -> ReceiverProcess:
        if name not in started:
            receiver = ReceiverProcess(log_dir, name=name, command=STACKS[name].command)
            started[name] = receiver.start()
        assert started[name].running, f"{name} exited:\n{started[name].log()[-3000:]}"
        return started[name]

    yield get
    for receiver in started.values():
        receiver.stop()


@pytest.fixture(scope="module")
def worker(module_procs):
    """The module's worker (the usual delivery timings of tests.webhook_checks)."""
    return start_worker(module_procs)


# --- the receivers answer as their stacks do ------------------------------------------------


@dataclass
class Probe:
    response: h11.Response
    body: bytes
    reads: int  # body pieces received (separate socket reads)
    closed: bool  # the server closed the connection after the answer


def probe(receiver: ReceiverProcess, path: str) -> Probe:
    """One POST with h11 (a parser of our own choosing, not the transport under test)."""
    conn = h11.Connection(h11.CLIENT)
    body = b"{}"
    request = h11.Request(
        method="POST",
        target=path,
        headers=[
            ("Host", f"{HOST}:{receiver.port}"),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("webhook-id", "probe"),
        ],
    )
    out = conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
    response, pieces = None, []
    with socket.create_connection((HOST, receiver.port), timeout=5) as sock:
        sock.sendall(out)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                pieces.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
        closed = conn.their_state in (h11.MUST_CLOSE, h11.CLOSED) and sock.recv(1) == b""
    assert response is not None
    return Probe(response, b"".join(pieces), len(pieces), closed)


@pytest.mark.parametrize(("stack", "path"), cases(DELIVERED + FINAL))
def test_the_receiver_answers_as_its_stack_does(stacks, stack, path):
    """What the matrix claims of each case, seen by an independent client: otherwise a
    passing delivery test could be a case that never exercised its answer."""
    receiver = stacks(stack)
    got = probe(receiver, path)
    expected = answers.ANSWERS[path]
    headers = {k.decode().lower(): v for k, v in got.response.headers}
    assert got.response.status_code == expected["status"]
    assert got.response.http_version == STACKS[stack].http_version
    assert got.body == answers.body_for(expected)
    if expected["kind"] == "chunked":
        assert headers.get("transfer-encoding") == b"chunked"
        assert "content-length" not in headers
    if expected["kind"] == "close":
        assert headers.get("connection") == b"close"
        assert got.closed
    if expected["kind"] == "eof":  # neither length nor chunks: the close ends the body
        assert "content-length" not in headers
        assert "transfer-encoding" not in headers
    if expected["kind"] == "slow":
        assert got.reads > 1, "the body came in one piece"
    if expected["kind"] == "redirect":
        assert headers["location"] == answers.REDIRECT_TARGET.encode()
    if STACKS[stack].http_version == b"1.0" or stack == "gunicorn-sync":
        assert got.closed, "closed after every answer"
    record = receiver.records()[-1]
    assert (record.path, record.header("webhook-id")) == (path, "probe")
    assert record.answer == expected


# --- deliveries -----------------------------------------------------------------------------


def wait_final(config: PushConfig, timeout: float = 30) -> None:
    """Until the task is terminal and every delivery it owes is delivered or dead: a receiver
    refusing them ends the wait early, and the assertions then say what it answered."""

    def final() -> bool:
        if not Task.objects.filter(pk=config.task_id, state__in=TERMINAL_STATES).exists():
            return False
        rows = deliveries(config)
        done = (DeliveryState.DELIVERED, DeliveryState.DEAD)
        return [d.seq for d in rows] == owed_seqs(config) and all(d.state in done for d in rows)

    wait_until(final, timeout=timeout, message=f"config {config.pk}: every delivery final")


def tries(config: PushConfig) -> list[list[int | None]]:
    """Each delivery's tries' statuses."""
    return [
        list(DeliveryAttempt.objects.filter(delivery=d).values_list("status", flat=True))
        for d in deliveries(config)
    ]


def report(config: PushConfig, receiver: ReceiverProcess) -> str:
    """What was sent and answered, for a failure message: each delivery's tries (status,
    error, the answer's excerpt), and what the receiver recorded."""
    lines = []
    for d in deliveries(config):
        lines.append(f"delivery seq {d.seq} {d.state}:")
        for a in DeliveryAttempt.objects.filter(delivery=d):
            excerpt = a.response_excerpt[:200]
            lines.append(f"  try {a.number}: {a.status} {a.error_class!r} {excerpt!r}")
    for r in receiver.records()[-10:]:
        lines.append(f"received #{r.n} {r.method} {r.path} {r.answer} {list(r.raw_headers)}")
    return "\n".join(lines)


def of_config(receiver: ReceiverProcess, config: PushConfig) -> list[Record]:
    ids = {str(d.event_id) for d in deliveries(config)}
    return [r for r in receiver.records() if r.header("webhook-id") in ids]


def assert_headers_once(records: list[Record], stack: str) -> None:
    """No header name twice on the wire. Where the stack hands over the raw list, any name;
    behind WSGI a repeat arrives joined with ",", which our User-Agent never contains."""
    for record in records:
        if STACKS[stack].raw_headers:
            names = Counter(name.lower() for name, _ in record.raw_headers)
            repeated = sorted(name for name, count in names.items() if count > 1)
            assert not repeated, f"{stack} got {repeated} repeated: {record.raw_headers}"
        else:
            agent = record.header("user-agent") or ""
            assert "," not in agent, f"{stack} got User-Agent repeated: {agent!r}"


@pytest.mark.parametrize(("stack", "path"), cases(DELIVERED))
def test_every_event_arrives_in_order_verified_once_each(
    stacks, worker, scripted_agent, stack, path
):
    """Accepted on this stack with this answer: the snapshot and every status/artifact event,
    in order, each once (one try each), verified, with each header once."""
    receiver = stacks(stack).at(path)
    _, (config,) = open_task(scripted_agent, "chunks 3", {"url": receiver.url})
    wait_final(config)

    states = [d.state for d in deliveries(config)]
    assert states == [DeliveryState.DELIVERED] * len(states), report(config, receiver)
    records = assert_delivered(
        receiver, config, scripted_agent, records=of_config(receiver, config)
    )
    # submitted (snapshot), working, three chunks, the echo artifact, completed.
    assert len(records) == 7
    assert {r.answer["kind"] for r in records} == {answers.ANSWERS[path]["kind"]}
    assert tries(config) == [[200]] * len(records), report(config, receiver)
    assert_headers_once(records, stack)


@pytest.mark.parametrize(("stack", "path"), cases(FINAL))
def test_a_final_refusal_is_dead_lettered_after_one_try(
    stacks, worker, scripted_agent, stack, path
):
    """410 and 302 are final: each delivery is tried once, recorded with the status and
    dead-lettered (a dead one does not hold back the next). A 302 is not followed: the
    receiver sees the one request per delivery, never one on the Location target."""
    receiver = stacks(stack).at(path)
    status = answers.ANSWERS[path]["status"]
    _, (config,) = open_task(scripted_agent, "chunks 3", {"url": receiver.url})
    wait_final(config)

    rows = deliveries(config)
    assert [d.state for d in rows] == [DeliveryState.DEAD] * len(rows), report(config, receiver)
    assert tries(config) == [[status]] * len(rows), report(config, receiver)
    assert all(d.attempts == 1 and d.last_status == status and d.finished_at for d in rows)
    records = of_config(receiver, config)
    verify(records, scripted_agent, url=receiver.url)
    assert [r.webhook_id for r in records] == [str(d.event_id) for d in rows]
    assert {r.path for r in records} == {path}
    assert {r.answer["status"] for r in records} == {status}
    followed = [r for r in receiver.records() if r.path.startswith(answers.REDIRECT_TARGET)]
    assert not followed, f"the redirect was followed: {followed}"
    assert_headers_once(records, stack)
