"""The delivery transport: one POST, returned as a value (STYLE.md "Delivery").

A send never raises for a network or HTTP problem: it returns a `TransportResult` whose
`error_class` names what went wrong, and leaves the retry decision to the delivery policy.

- `ssrf`     the destination is refused (webhooks/ssrf.py), before or at connect time.
             Nothing was sent. Final unless the URL's DNS changes.
- `dns`      the host did not resolve. Nothing was sent.
- `connect`  no TCP connection (refused, unreachable). Nothing was sent.
- `tls`      the TLS handshake failed (certificate, protocol). Nothing was sent.
- `timeout`  connect, send or response took longer than `timeout` in total (may have been
             received).
- `network`  the connection broke after it was made (may have been received).
- `protocol` the receiver spoke broken HTTP, or the request could not be framed.
- `request`  the request itself could not be built (e.g. a header value that is not ASCII).
- `internal` a bug in this module, caught by `submit` (logged; `post` lets it surface).

How it sends: one asyncio event loop per process, on a thread of its own (`webhook-sender`),
runs every send as a task, so a hung receiver holds one task, never a thread or the others.
`submit` hands it a batch and returns a `concurrent.futures.Future` per request (the delivery
pump's path); `post` sends one and waits. HTTP/1.1 is framed here and parsed by httptools
(llhttp), over keep-alive connections pooled per origin. A general-purpose client cost the
pump most of its CPU (bench/delivery_bench.py --profile): httpx's models, then httpcore and
h11 on a thread per send.

SSRF is enforced inside the transport, not only before it: every send checks the URL
(webhooks/ssrf.py), and every new connection resolves the host again, checks every address and
connects to a checked address, so a DNS answer that changes between the check and the
connection (rebinding) is refused. The host name still goes out as TLS SNI and in Host, so
certificates and virtual hosts work as usual. No proxies (a proxy would make the connection,
and the check would be about the proxy). Redirects are never followed; a 3xx is returned as is.

`timeout` is a deadline for the whole attempt (URL check + connect + TLS + send + response
head + body excerpt), not per socket operation, so a receiver that trickles bytes cannot hold a
send. Name resolution runs on the sender's resolver threads (`RESOLVER_THREADS`); a lookup
outliving the deadline finishes there, unwaited.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import math
import os
import re
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import NamedTuple

import httptools
import httpx

from webhooks import ssrf
from webhooks.ssrf import ParsedTarget, UnsafeDestination

logger = logging.getLogger(__name__)

EXCERPT_BYTES = 2048
# A status line and headers longer than this are refused (`protocol`).
MAX_HEAD_BYTES = 65536
USER_AGENT = "a2a-platform-webhooks/1"
# Idle keep-alive connections are reused for this long, and at most this many are kept.
KEEPALIVE_SECONDS = 5.0
MAX_IDLE_CONNECTIONS = 256
RESOLVER_THREADS = 32


@dataclass(frozen=True)
class TransportResult:
    status: int | None
    headers: dict[str, str]
    body_excerpt: str
    duration_ms: float
    error_class: str | None
    retry_after: float | None
    # A short human explanation of `error_class` (never contains the URL's path or query).
    error_detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class PostRequest(NamedTuple):
    url: str
    body: bytes | str
    headers: Mapping[str, str]


# --- the public calls --------------------------------------------------------------------


def submit(
    requests: Sequence[PostRequest], timeout: float
) -> list[concurrent.futures.Future[TransportResult]]:
    """Start sending `requests` on the process's sender loop (one wake-up for the batch); a
    future per request, each resolving to a result, never to an exception."""
    futures: list[concurrent.futures.Future[TransportResult]] = [
        concurrent.futures.Future() for _ in requests
    ]
    if requests:
        _sender().call(_start, list(zip(requests, futures, strict=True)), timeout, guarded=True)
    return futures


def post(
    url: str, body: bytes | str, headers: Mapping[str, str], *, timeout: float
) -> TransportResult:
    """POST `body` (str is sent as UTF-8) to `url` and wait for the result; never follows
    redirects, never raises for network or HTTP problems. `timeout` bounds the whole attempt."""
    future: concurrent.futures.Future[TransportResult] = concurrent.futures.Future()
    _sender().call(_start, [(PostRequest(url, body, headers), future)], timeout, guarded=False)
    return future.result()


def close_client() -> None:
    """Close the process's idle connections (worker shutdown, tests)."""
    sender = _current
    if sender is not None and sender.pid == os.getpid():
        sender.call_and_wait(sender.pool.close_all)


# --- the sender loop ----------------------------------------------------------------------


class _Sender:
    """An event loop on a daemon thread, with its connection pool."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.pool = _Pool()
        self.ssl_context = httpx.create_ssl_context()
        self.thread = threading.Thread(target=self._run, name="webhook-sender", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        # Name resolution blocks a thread per lookup; enough of them that a few receivers
        # whose DNS hangs cannot hold up every other receiver's lookups.
        self.loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(
                max_workers=RESOLVER_THREADS, thread_name_prefix="webhook-dns"
            )
        )
        self.loop.run_forever()

    def call(self, fn, *args, **kwargs) -> None:
        self.loop.call_soon_threadsafe(functools.partial(fn, self, *args, **kwargs))

    def call_and_wait(self, fn) -> None:
        done = concurrent.futures.Future()

        def run() -> None:
            try:
                fn()
            finally:
                done.set_result(None)

        self.loop.call_soon_threadsafe(run)
        done.result(timeout=10)


_sender_lock = threading.Lock()
_current: _Sender | None = None


def _sender() -> _Sender:
    """The process's sender (thread-safe); a forked child starts its own."""
    global _current
    sender = _current
    if sender is not None and sender.pid == os.getpid():
        return sender
    with _sender_lock:
        if _current is None or _current.pid != os.getpid():
            _current = _Sender()
        return _current


def _start(sender: _Sender, batch, timeout: float, *, guarded: bool) -> None:
    """On the loop: one task per request, settling its caller's future."""
    for request, future in batch:
        if not future.set_running_or_notify_cancel():
            continue
        task = sender.loop.create_task(_attempt(sender, request, timeout))
        task.add_done_callback(functools.partial(_settle, future, guarded, time.perf_counter()))


def _settle(
    future: concurrent.futures.Future[TransportResult],
    guarded: bool,
    started: float,
    task: asyncio.Task[TransportResult],
) -> None:
    if task.cancelled():
        future.set_result(_failure("internal", "the send was cancelled", started))
        return
    exc = task.exception()
    if exc is None:
        future.set_result(task.result())
    elif guarded:
        logger.error("webhook post failed unexpectedly", exc_info=exc)
        future.set_result(_failure("internal", f"{type(exc).__name__}: {exc}", started))
    else:
        future.set_exception(exc)


# --- one attempt ----------------------------------------------------------------------------


class _Broken(Exception):
    """No connection, a connection that broke, or broken HTTP (`error_class` says which)."""

    def __init__(self, error_class: str, detail: str) -> None:
        super().__init__(detail)
        self.error_class = error_class


async def _attempt(sender: _Sender, request: PostRequest, timeout: float) -> TransportResult:
    started = time.perf_counter()
    body = request.body.encode("utf-8") if isinstance(request.body, str) else request.body
    connection: _Connection | None = None
    try:
        async with asyncio.timeout(timeout):
            target = ssrf.parse_url(request.url)
            head = _request_head(target, request.headers, len(body))
            addresses = await _addresses(sender, target)
            ssrf.check_addresses(target, addresses)
            connection = sender.pool.take(target)
            if connection is not None:
                try:
                    connection.send(head, body)
                    await connection.head_received()
                except _Broken:
                    if connection.received:
                        raise
                    # Closed by the receiver while idle, before a byte of the answer: the
                    # usual keep-alive race, not a failing endpoint. Once more, on a new one.
                    connection.close()
                    connection = None
            if connection is None:
                connection = await _connect(sender, target)
                connection.send(head, body)
                await connection.head_received()
        # The status line is the receiver's answer: a body that breaks or stalls afterwards
        # is noted on the result, not turned into a failure.
        detail = await connection.read_excerpt(deadline=started + timeout)
        status, answer, excerpt = connection.status, connection.headers, connection.excerpt
        if connection.reusable():
            sender.pool.give(target, connection)
        else:
            connection.close()
        connection = None
        return TransportResult(
            status=status,
            headers=answer,
            body_excerpt=_decode(excerpt, _charset(answer.get("content-type"))),
            duration_ms=_elapsed_ms(started),
            error_class=None,
            retry_after=parse_retry_after(answer.get("retry-after")),
            error_detail=detail,
        )
    except UnsafeDestination as exc:
        return _failure("dns" if exc.reason == "unresolvable" else "ssrf", str(exc), started)
    except TimeoutError:
        return _failure("timeout", "the delivery timeout elapsed", started)
    except _Broken as exc:
        return _failure(exc.error_class, str(exc), started)
    except (UnicodeError, ValueError) as exc:
        return _failure("request", f"{type(exc).__name__}: {exc}", started)
    except OSError as exc:
        return _failure("network", f"{type(exc).__name__}: {exc}", started)
    finally:
        if connection is not None:
            connection.close()


async def _addresses(sender: _Sender, target: ParsedTarget) -> list[str]:
    if target.literal:
        return [target.host]
    return await sender.loop.run_in_executor(None, ssrf.resolve, target.host, target.port)


async def _connect(sender: _Sender, target: ParsedTarget) -> _Connection:
    """A new connection: resolve again, check every address, connect to the first checked
    address that answers."""
    addresses = await _addresses(sender, target)
    try:
        ssrf.check_addresses(target, addresses)
    except UnsafeDestination as exc:
        logger.warning(
            "webhook connect refused",
            extra={"host": target.host, "addresses": addresses, "reason": exc.reason},
        )
        raise
    tls = sender.ssl_context if target.scheme == "https" else None
    last: Exception | None = None
    for address in addresses:
        try:
            _, connection = await sender.loop.create_connection(
                _Connection,
                host=address,
                port=target.port,
                ssl=tls,
                server_hostname=target.host if tls else None,
            )
            return connection
        except (ssl.SSLError, ssl.CertificateError) as exc:
            raise _Broken("tls", f"{type(exc).__name__}: {exc}") from None
        except OSError as exc:
            last = exc
    raise _Broken("connect", f"{type(last).__name__}: {last}")


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_FRAMING = {"host", "content-length", "transfer-encoding", "connection"}


def _request_head(target: ParsedTarget, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and headers. Header names must be tokens and values ASCII without
    control characters (no header injection); framing headers are ours alone."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    if target.port != (443 if target.scheme == "https" else 80):
        host = f"{host}:{target.port}"
    lines = [
        f"POST {target.path_qs} HTTP/1.1",
        f"Host: {host}",
        f"User-Agent: {USER_AGENT}",
        # identity: the excerpt is 2 KB, never decompress (a small gzip can be huge).
        "Accept-Encoding: identity",
        f"Content-Length: {length}",
    ]
    for name, value in headers.items():
        if not _TOKEN.match(name):
            raise ValueError(f"{name!r} is not a valid header name")
        if name.lower() in _FRAMING:
            raise ValueError(f"the {name} header is set by the transport")
        if _BAD_VALUE.search(value):
            raise ValueError(f"the {name} header has a control character")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, the response parsed by httptools."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._error: _Broken | None = None
        self.reset()

    # asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self._busy or self._complete:
            self._fail(_Broken("protocol", "data outside a response"))
            self.close()
            return
        self.received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(_Broken("protocol", "the receiver switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(_Broken("protocol", f"malformed HTTP response: {exc}"))
        if not self._have_head and self.received > MAX_HEAD_BYTES:
            self._fail(_Broken("protocol", f"response head longer than {MAX_HEAD_BYTES} bytes"))
            self.close()

    def eof_received(self) -> bool:
        if self._have_head and not self._complete:
            # A body delimited by the end of the connection (HTTP/1.0 style) ends here.
            self._complete = True
        self._fail(_Broken("network", "the receiver closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(_Broken("network", f"connection lost: {exc}" if exc else "connection closed"))

    # httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            self._fail(_Broken("protocol", f"response head longer than {MAX_HEAD_BYTES} bytes"))
            raise ValueError("response head too long")  # stops the parser
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self.headers = {}  # an interim response: the final one follows
            self._head_bytes = 0
            return
        self.status = status
        self._have_head = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if len(self._body) < EXCERPT_BYTES:
            self._body += body
            if len(self._body) >= EXCERPT_BYTES:
                self._wake()

    def on_message_complete(self) -> None:
        if not self._have_head:
            return  # the interim response ended
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()

    # the attempt's side

    def send(self, head: bytes, body: bytes) -> None:
        if self.closed or self.transport is None:
            raise _Broken("network", "the connection closed before the request")
        self._busy = True
        self.transport.write(head + body)

    async def head_received(self) -> None:
        while not self._have_head:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read_excerpt(self, *, deadline: float) -> str | None:
        """Read the body up to EXCERPT_BYTES (`excerpt`); a note when it broke or stalled."""
        try:
            async with asyncio.timeout(max(0.0, deadline - time.perf_counter())):
                while not self._complete and len(self._body) < EXCERPT_BYTES:
                    if self._error is not None:
                        raise self._error
                    await self._wait()
        except TimeoutError:
            return "response body: timeout"
        except _Broken as exc:
            return f"response body: {exc}"
        finally:
            self.excerpt = bytes(self._body[:EXCERPT_BYTES])
        return None

    @property
    def healthy(self) -> bool:
        return self._error is None

    def reusable(self) -> bool:
        return self._complete and self._keep_alive and self._error is None and not self.closed

    def reset(self) -> None:
        """Ready for the next request on this connection."""
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.excerpt = b""
        self.received = 0  # bytes of the answer so far
        self._head_bytes = 0
        self._body = bytearray()
        self._busy = self._have_head = self._complete = self._keep_alive = False

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: _Broken) -> None:
        if self._error is None:
            self._error = error
        self._wake()


class _Pool:
    """Idle keep-alive connections per origin (loop thread only, so no lock)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._count = 0

    def take(self, target: ParsedTarget) -> _Connection | None:
        idle = self._idle.get((target.scheme, target.host, target.port))
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            self._count -= 1
            fresh = now - connection.idle_since < KEEPALIVE_SECONDS
            if fresh and not connection.closed and connection.healthy:
                return connection
            connection.close()
        return None

    def give(self, target: ParsedTarget, connection: _Connection) -> None:
        """Keep `connection` for reuse; when the pool is full even after dropping what has
        expired, close it instead."""
        if self._count >= MAX_IDLE_CONNECTIONS:
            self._drop_expired()
        if self._count >= MAX_IDLE_CONNECTIONS:
            connection.close()
            return
        connection.reset()
        connection.idle_since = time.monotonic()
        self._idle.setdefault((target.scheme, target.host, target.port), []).append(connection)
        self._count += 1

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for key, idle in list(self._idle.items()):
            kept = [c for c in idle if not c.closed and now - c.idle_since < KEEPALIVE_SECONDS]
            for connection in set(idle) - set(kept):
                connection.close()
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        self._count = sum(len(idle) for idle in self._idle.values())

    def close_all(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        self._count = 0


# --- results --------------------------------------------------------------------------------

_SECONDS = re.compile(r"^\d{1,10}(?:\.\d+)?$")


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or HTTP-date, RFC 9110
    §10.2.3); None when absent or unreadable. A date in the past means 0."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS.match(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _decode(data: bytes, charset: str | None) -> str:
    try:
        return data.decode(charset or "utf-8", errors="replace")
    except LookupError:  # unknown, or not a text encoding ("base64")
        return data.decode("utf-8", errors="replace")


def _elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _failure(error_class: str, detail: str, started: float) -> TransportResult:
    return TransportResult(
        status=None,
        headers={},
        body_excerpt="",
        duration_ms=_elapsed_ms(started),
        error_class=error_class,
        retry_after=None,
        error_detail=detail[:300],
    )


_CHARSET = re.compile(r"charset\s*=\s*\"?([A-Za-z0-9._-]{1,40})", re.IGNORECASE)


def _charset(content_type: str | None) -> str | None:
    match = _CHARSET.search(content_type or "")
    return match.group(1) if match else None
