"""webhooks.delivery.transport against a real HTTP receiver on 127.0.0.1 (a ThreadingHTTPServer).

The receiver counts accepted TCP connections as well as requests, so "refused" means nothing
reached it at all. DNS is the edge we do not own: the rebinding tests fake `getaddrinfo`
(`fake_dns`, conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.factories import task_create, user_message
from webhooks.delivery import ssrf, transport
from webhooks.delivery.transport import PostRequest, TransportResult, post

# A new connection pool per test: a kept-alive connection must not stand in for a new
# connect or handshake (conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_transport")

PUBLIC_V4 = "93.184.215.14"
BIG_BODY = b"x" * 100_000


class Recorded:
    def __init__(self, path: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.path = path
        self.headers = headers
        self.body = body
        self.at = time.monotonic()

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, receiver: Receiver, handler: type[_Handler]) -> None:
        self.receiver = receiver
        super().__init__(("127.0.0.1", 0), handler)

    def verify_request(self, request, client_address) -> bool:
        with self.receiver.lock:
            self.receiver.connections += 1
        return True


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format, *args) -> None:  # noqa: A002
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        receiver = self.server.receiver
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with receiver.lock:
            receiver.requests.append(Recorded(self.path, list(self.headers.items()), body))
        path = self.path.split("?", 1)[0]
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            getattr(self, "route_" + path.strip("/").replace("-", "_"))()

    def answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def route_ok(self) -> None:
        self.answer(200, b'{"ok":true}', {"X-Receiver": "yes", "Content-Type": "application/json"})

    def route_fail(self) -> None:
        self.answer(500, b"boom")

    def route_throttle(self) -> None:
        self.answer(429, b"slow down", {"Retry-After": "7"})

    def route_unavailable(self) -> None:
        when = email.utils.formatdate(time.time() + 120, usegmt=True)
        self.answer(503, b"", {"Retry-After": when})

    def route_redirect(self) -> None:
        host, port = self.server.server_address[:2]
        self.answer(302, b"", {"Location": f"http://{host}:{port}/ok"})

    def route_big(self) -> None:
        self.answer(200, BIG_BODY)

    def route_hang(self) -> None:
        self.server.receiver.release.wait(30)
        self.answer(200, b"late")

    def route_drip(self) -> None:
        # Status line and headers one byte at a time: every read finishes well inside the
        # per-read timeout, only the attempt's deadline can stop it.
        payload = b"HTTP/1.0 200 OK\r\nX-Slow: " + b"z" * 200 + b"\r\n\r\n"
        for byte in payload:
            if self.server.receiver.release.is_set():
                return
            self.wfile.write(bytes([byte]))
            time.sleep(0.1)

    def raw(self, payload: bytes) -> None:
        self.wfile.write(payload)
        self.close_connection = True

    def route_chunked(self) -> None:
        self.raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )

    def route_until_close(self) -> None:  # no length, no chunks: the body ends with the connection
        self.raw(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close")

    def route_interim(self) -> None:
        self.raw(
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        )

    def route_garbage(self) -> None:
        self.raw(b"SPEAKING NONSENSE\r\n\r\n")

    def route_huge_head(self) -> None:
        self.raw(b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * 100_000 + b"\r\n\r\n")


class _KeepAliveHandler(_Handler):
    protocol_version = "HTTP/1.1"


class Receiver:
    def __init__(self, handler: type[_Handler] = _Handler) -> None:
        self.lock = threading.Lock()
        self.requests: list[Recorded] = []
        self.connections = 0
        self.release = threading.Event()
        self.server = _Server(self, handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def url(self, path: str, *, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    r.thread.start()
    yield r
    r.stop()


@pytest.fixture
def keep_alive_receiver():
    r = Receiver(_KeepAliveHandler)
    r.thread.start()
    yield r
    r.stop()


@pytest.fixture
def allow_loopback(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture
def no_allowlist(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = []


def assert_nothing_received(receiver: Receiver) -> None:
    time.sleep(0.05)  # an accepted connection is counted on the server's thread
    assert receiver.connections == 0
    assert receiver.requests == []


# --- answers -----------------------------------------------------------------------------


def test_post_ok_sends_exact_bytes_and_headers(receiver, allow_loopback):
    body = json.dumps({"statusUpdate": {"taskId": "t-1", "text": "héllo ✓"}}).encode() + b"\n"
    headers = {
        "Content-Type": "application/a2a+json",
        "Authorization": "Bearer abc.def",
        "webhook-id": "evt_123",
        "webhook-signature": "v1a,AAAA v1a,BBBB",
    }

    result = post(receiver.url("/ok?task=t-1"), body, headers, timeout=5)

    assert isinstance(result, TransportResult)
    assert result.ok
    assert result.status == 200
    assert result.error_class is None
    assert result.retry_after is None
    assert result.headers["x-receiver"] == "yes"
    assert result.body_excerpt == '{"ok":true}'
    assert result.duration_ms > 0
    [got] = receiver.requests
    assert got.path == "/ok?task=t-1"
    assert got.body == body
    for name, value in headers.items():
        assert got.header(name) == value
    assert got.header("Content-Length") == str(len(body))
    assert got.header("Host") == f"127.0.0.1:{receiver.port}"


def test_post_str_body_is_sent_as_utf8(receiver, allow_loopback):
    result = post(receiver.url("/ok"), '{"a":"é"}', {"Content-Type": "application/json"}, timeout=5)
    assert result.ok
    assert receiver.requests[0].body == '{"a":"é"}'.encode()


def test_post_sends_a_non_ascii_query_percent_encoded(receiver, allow_loopback):
    result = post(receiver.url("/ok?q=\u00fc&r=\u2713"), b"{}", {}, timeout=5)
    assert result.status == 200
    assert [r.path for r in receiver.requests] == ["/ok?q=%C3%BC&r=%E2%9C%93"]


def test_post_500_is_a_value(receiver, allow_loopback):
    result = post(receiver.url("/fail"), b"{}", {}, timeout=5)
    assert result.status == 500
    assert not result.ok
    assert result.error_class is None
    assert result.body_excerpt == "boom"


def test_post_429_retry_after_seconds(receiver, allow_loopback):
    result = post(receiver.url("/throttle"), b"{}", {}, timeout=5)
    assert result.status == 429
    assert result.retry_after == 7.0


def test_post_503_retry_after_http_date(receiver, allow_loopback):
    result = post(receiver.url("/unavailable"), b"{}", {}, timeout=5)
    assert result.status == 503
    assert result.retry_after is not None
    assert 100 < result.retry_after <= 121


def test_post_redirect_is_not_followed(receiver, allow_loopback):
    result = post(receiver.url("/redirect"), b"{}", {}, timeout=5)
    assert result.status == 302
    assert not result.ok
    assert result.headers["location"].endswith("/ok")
    assert [r.path for r in receiver.requests] == ["/redirect"]


def test_post_body_excerpt_is_2kb(receiver, allow_loopback):
    result = post(receiver.url("/big"), b"{}", {}, timeout=5)
    assert result.ok
    assert result.body_excerpt == "x" * transport.EXCERPT_BYTES


def test_post_reads_a_chunked_answer(receiver, allow_loopback):
    result = post(receiver.url("/chunked"), b"{}", {}, timeout=5)
    assert (result.status, result.body_excerpt) == (200, "hello world")


def test_post_reads_a_body_that_ends_with_the_connection(receiver, allow_loopback):
    result = post(receiver.url("/until-close"), b"{}", {}, timeout=5)
    assert (result.status, result.body_excerpt, result.error_detail) == (200, "until close", None)


def test_post_skips_an_interim_response(receiver, allow_loopback):
    result = post(receiver.url("/interim"), b"{}", {}, timeout=5)
    assert (result.status, result.body_excerpt) == (201, "ok")


# --- connections ---------------------------------------------------------------------------


def test_post_reuses_a_kept_alive_connection(keep_alive_receiver, allow_loopback):
    results = [post(keep_alive_receiver.url("/ok"), b"{}", {}, timeout=5) for _ in range(3)]
    assert [r.status for r in results] == [200, 200, 200]
    assert len(keep_alive_receiver.requests) == 3
    assert keep_alive_receiver.connections == 1


def test_a_connection_the_receiver_closes_is_not_reused(receiver, allow_loopback):
    results = [post(receiver.url("/ok"), b"{}", {}, timeout=5) for _ in range(3)]
    assert [r.status for r in results] == [200, 200, 200]
    assert receiver.connections == 3


def test_a_kept_alive_connection_closed_by_the_receiver_is_replaced(allow_loopback):
    # The keep-alive race: the receiver drops an idle connection just as the next request is
    # written on it. Nothing of an answer came back, so the transport sends on a new one.
    answers = []
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    def serve(listener: socket.socket) -> None:  # each request fits one read here
        first, _ = listener.accept()
        first.recv(65536)
        answers.append("first connection")
        first.sendall(ok)
        first.recv(65536)  # the second request: dropped unanswered
        first.close()
        second, _ = listener.accept()
        second.recv(65536)
        answers.append("second connection")
        second.sendall(ok)
        second.close()

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        server = threading.Thread(target=serve, args=(listener,), daemon=True)
        server.start()
        first = post(f"http://127.0.0.1:{port}/a", b"{}", {}, timeout=5)
        second = post(f"http://127.0.0.1:{port}/b", b"{}", {}, timeout=5)
        server.join(timeout=5)

    assert (first.status, second.status) == (200, 200)
    assert answers == ["first connection", "second connection"]


def test_a_hung_receiver_does_not_hold_other_sends(receiver, allow_loopback):
    hung, ok = transport.submit(
        [
            PostRequest(receiver.url("/hang"), b"{}", {}),
            PostRequest(receiver.url("/ok"), b"{}", {}),
        ],
        timeout=10,
    )
    assert ok.result(timeout=5).status == 200
    assert not hung.done()
    receiver.release.set()
    assert hung.result(timeout=5).status == 200


# --- failures as values ----------------------------------------------------------------------


def test_post_hanging_receiver_times_out(receiver, allow_loopback):
    result = post(receiver.url("/hang"), b"{}", {}, timeout=1.0)
    assert result.error_class == "timeout"
    assert result.status is None
    assert not result.ok
    assert 900 <= result.duration_ms < 5000
    assert len(receiver.requests) == 1


def test_post_dripping_receiver_is_stopped_by_the_deadline(receiver, allow_loopback):
    # ~21 s of headers at 0.1 s a byte: a per-read timeout would never fire.
    result = post(receiver.url("/drip"), b"{}", {}, timeout=1.0)
    assert result.error_class == "timeout"
    assert result.duration_ms < 5000


def test_post_connection_refused(allow_loopback):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = post(f"http://127.0.0.1:{port}/", b"{}", {}, timeout=5)
    assert result.error_class == "connect"
    assert result.status is None


def test_post_tls_handshake_failure(receiver, allow_loopback):
    result = post(receiver.url("/ok", scheme="https"), b"{}", {}, timeout=5)
    assert result.error_class == "tls"
    assert receiver.requests == []


def test_post_unresolvable_host(fake_dns, no_allowlist):
    fake_dns.answers["nowhere.test"] = []
    result = post("https://nowhere.test/", b"{}", {}, timeout=5)
    assert result.error_class == "dns"


# --- SSRF --------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_post_not_allowlisted_is_refused_and_nothing_received(receiver, no_allowlist, scheme):
    result = post(receiver.url("/ok", scheme=scheme), b"{}", {}, timeout=5)
    assert result.error_class == "ssrf"
    assert result.status is None
    assert result.error_detail
    assert_nothing_received(receiver)


def test_post_decimal_literal_is_refused(receiver, no_allowlist):
    result = post(f"https://2130706433:{receiver.port}/ok", b"{}", {}, timeout=5)
    assert result.error_class == "ssrf"
    assert "loopback" in (result.error_detail or "")
    assert_nothing_received(receiver)


@pytest.mark.parametrize(
    "at_connect",
    [["127.0.0.1"], [PUBLIC_V4, "127.0.0.1"], ["::ffff:127.0.0.1"], ["169.254.169.254"]],
)
def test_post_dns_rebinding_is_refused_at_connect(receiver, no_allowlist, fake_dns, at_connect):
    # The registration's check sees a public address; the connect-time lookup answers with a
    # forbidden one (and nothing is connected to, not even the public address beside it).
    fake_dns.answers["rebind.test"] = [[PUBLIC_V4], at_connect]
    url = receiver.url("/ok", host="rebind.test", scheme="https")
    ssrf.check_url(url)

    result = post(url, b"{}", {}, timeout=5)

    assert result.error_class == "ssrf"
    assert fake_dns.lookups == ["rebind.test", "rebind.test"]
    assert_nothing_received(receiver)


def test_plain_http_rebound_to_a_public_address_is_refused_at_connect(
    receiver, allow_loopback, fake_dns
):
    # http is allowed to the allowlisted loopback the check sees, never to the internet.
    fake_dns.answers["rebind.test"] = [["127.0.0.1"], [PUBLIC_V4]]
    url = receiver.url("/ok", host="rebind.test")
    ssrf.check_url(url)

    result = post(url, b"{}", {}, timeout=5)

    assert result.error_class == "ssrf"
    assert "plain http" in result.error_detail
    assert fake_dns.lookups == ["rebind.test", "rebind.test"]
    assert_nothing_received(receiver)


def test_the_connect_time_resolver_refuses_by_itself(no_allowlist, fake_dns):
    # Whatever asks it, the connector's resolver checks: a second line of defence behind the
    # URL check, and it resolves only the host the check parsed.
    fake_dns.answers["inside.test"] = [["10.0.0.7"]]
    sender = transport._sender()
    resolver = transport._CheckingResolver(sender.loop, sender.resolver_pool)

    def resolve(host: str, target: ssrf.ParsedTarget):
        async def run():
            transport._target.set(target)
            return await resolver.resolve(host, 443)

        return asyncio.run_coroutine_threadsafe(run(), sender.loop).result(timeout=5)

    inside = ssrf.ParsedTarget("https", "inside.test", 443, "/")
    with pytest.raises(transport.UnsafeDestination) as refused:
        resolve("inside.test", inside)
    assert refused.value.reason == "private"
    with pytest.raises(transport.UnsafeDestination) as other:
        resolve("elsewhere.test", inside)
    assert other.value.reason == "host"
    assert fake_dns.lookups == ["inside.test"]


def test_post_connects_to_the_checked_address_keeping_the_host_name(
    receiver, allow_loopback, fake_dns
):
    fake_dns.answers["receiver.test"] = [["127.0.0.1"]]

    result = post(receiver.url("/ok", host="receiver.test"), b"{}", {}, timeout=5)

    assert result.ok
    assert receiver.requests[0].header("Host") == f"receiver.test:{receiver.port}"
    # One lookup, by the connector's resolver, which checked the address it connected to.
    assert fake_dns.lookups == ["receiver.test"]


# --- the request on the wire ----------------------------------------------------------------


def _capture_one_request(listener: socket.socket, heads: list[bytes]) -> None:
    conn, _ = listener.accept()
    with conn:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")[1:]
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += conn.recv(65536)
        heads.append(head)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


@pytest.mark.django_db
def test_a_real_delivery_goes_out_with_each_header_once(agent, allow_loopback):
    """The head of a real claim's request as the receiver reads it, byte for byte: every
    header name once in any letter case (aiohttp's server answers 400 to a duplicate
    User-Agent), the config's token and credentials in their own headers only."""
    from webhooks.delivery.claim_record import delivery_claim_batch
    from webhooks.services import push_config_create

    heads: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        server = threading.Thread(target=_capture_one_request, args=(listener, heads))
        server.start()
        task = task_create(agent=agent, owner="o", message=user_message("hi"))
        push_config_create(
            task=task,
            config={
                "id": "cfg",
                "url": f"http://127.0.0.1:{port}/hook",
                "token": "tok",
                "authentication": {"scheme": "Bearer"},
            },
        )
        [claim] = delivery_claim_batch(limit=1).claims
        result = post(claim.url, claim.body, claim.headers, timeout=5)
        server.join(timeout=5)

    assert result.status == 200
    [head] = heads
    request_line, *lines = head.decode("ascii").split("\r\n")
    assert request_line == "POST /hook HTTP/1.1"
    names = [line.split(":", 1)[0].lower() for line in lines]
    assert len(names) == len(set(names)), f"a header twice: {names}"
    assert sorted(names) == sorted(
        {name.lower() for name in claim.headers}
        | {"host", "content-length", "user-agent", "accept-encoding"}
    )
    sent = dict(line.split(": ", 1) for line in lines)
    assert sent["Host"] == f"127.0.0.1:{port}"
    assert sent["Content-Length"] == str(len(claim.body))
    assert sent["User-Agent"] == transport.USER_AGENT
    assert sent["X-A2A-Notification-Token"] == "tok"
    assert sent["Authorization"].startswith("Bearer ey")


# --- guarded sends (the delivery pump's) ------------------------------------------------------


def test_post_header_value_that_is_not_ascii_is_a_request_error(receiver, allow_loopback):
    result = post(receiver.url("/ok"), b"{}", {"X-Token": "caf\u00e9"}, timeout=5)
    assert (result.status, result.error_class) == (None, "request")


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer x\r\nX-Injected: 1"},
        {"X-Token": "a\nb"},
        {"Bad Name": "x"},
        {"Content-Length": "0"},
        {"Host": "elsewhere.test"},
    ],
)
def test_post_header_injection_or_framing_is_a_request_error(receiver, allow_loopback, headers):
    result = post(receiver.url("/ok"), b"{}", headers, timeout=5)
    assert (result.status, result.error_class) == (None, "request")
    assert_nothing_received(receiver)


@pytest.mark.parametrize("route", ["/garbage", "/huge-head"])
def test_post_broken_http_is_a_protocol_error(receiver, allow_loopback, route):
    result = post(receiver.url(route), b"{}", {}, timeout=5)
    assert (result.status, result.error_class) == (None, "protocol")


def test_submit_sends_a_batch_like_post(receiver, allow_loopback):
    sends = transport.submit(
        [PostRequest(receiver.url("/ok"), b"{}", {}), PostRequest(receiver.url("/fail"), b"", {})],
        timeout=5,
    )
    assert [(f.result(5).status, f.result(5).error_class) for f in sends] == [
        (200, None),
        (500, None),
    ]


def test_submit_turns_a_bug_into_an_internal_result(monkeypatch):
    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(transport, "request_headers", broken)
    [send] = transport.submit([PostRequest("https://example.com/", b"{}", {})], timeout=1.0)
    result = send.result(timeout=5)
    assert (result.status, result.error_class) == (None, "internal")
    assert "RuntimeError: boom" in result.error_detail
    with pytest.raises(RuntimeError, match="boom"):  # post itself lets a bug surface
        post("https://example.com/", b"{}", {}, timeout=1.0)
