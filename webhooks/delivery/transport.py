"""The delivery transport: one POST, returned as a value (STYLE.md "Delivery").

A send never raises for a network or HTTP problem: it returns a `TransportResult` whose
`error_class` names what went wrong, and leaves the retry decision to the delivery policy.

- `ssrf`     the destination is refused (webhooks/delivery/ssrf.py), before or at connect time.
             Nothing was sent. Final unless the URL's DNS changes.
- `dns`      the host did not resolve. Nothing was sent.
- `connect`  no TCP connection (refused, unreachable). Nothing was sent.
- `tls`      the TLS handshake failed (certificate, protocol), or the CA bundle of
             A2A_WEBHOOK_CA_BUNDLE cannot be read. Nothing was sent.
- `timeout`  connect, send or response took longer than `timeout` in total (may have been
             received).
- `network`  the connection broke after it was made (may have been received).
- `protocol` the receiver spoke broken HTTP (or a response head over MAX_HEAD_BYTES).
- `request`  the request itself could not be built (e.g. a header value that is not ASCII).
- `internal` a bug in this module, caught by `submit` (logged; `post` lets it surface).

How it sends: aiohttp's client (HTTP/1.1 framing and parsing, keep-alive pooling per origin,
TLS), on one asyncio event loop per process running on a thread of its own
(`webhook-sender`); every send is a task on it, so a hung receiver holds one task, never a
thread or the others. `submit` hands it a batch and returns a `concurrent.futures.Future` per
request (the delivery pump's path); `post` sends one and waits. docs/perf-log.md ("Webhook
delivery and transport") has the measurement that chose aiohttp over the hand-framed HTTP
this module used to hold (docs/decisions.md, "Webhook transport and SSRF").

SSRF is enforced inside the transport, not only before it: the connector's resolver is ours
(`_CheckingResolver`). Every new connection resolves the host, checks every address against
the policy for this request's scheme and connects only to checked addresses, so a DNS answer
that changes between the registration's check and the connection (rebinding) is refused. An
IP-literal host is checked before the request. The host name still goes out as TLS SNI and in
Host, and the certificate is checked against it. No proxies (`trust_env` off: a proxy would
make the connection, and the check would be about the proxy). Redirects are never followed;
a 3xx is returned as is. Nothing is decompressed (`Accept-Encoding: identity`).

`timeout` is a deadline for the whole attempt (connect + TLS + send + response head + body
excerpt), not per socket operation, so a receiver that trickles bytes cannot hold a send.
Name resolution runs on the sender's resolver threads (`RESOLVER_THREADS`); a lookup outliving
the deadline finishes there, unwaited.

Request headers: the caller's (names are tokens, values printable ASCII, each name once in
any letter case), then ours: Host, Content-Length, User-Agent and Accept-Encoding belong to
the transport, and a caller naming one of them (or a hop-by-hop header) is a `request` error,
so no header ever goes out twice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import errno
import functools
import logging
import math
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from http import HTTPStatus
from types import SimpleNamespace
from typing import Any, NamedTuple

import aiohttp
import uvloop
import yarl
from aiohttp.abc import AbstractResolver, ResolveResult
from django.conf import settings
from multidict import CIMultiDict

from a2a_platform.lib.tracing import within_context
from webhooks.delivery import ssrf
from webhooks.delivery.ssrf import ParsedTarget, UnsafeDestination

logger = logging.getLogger(__name__)

EXCERPT_BYTES = 2048
# A status line plus headers longer than this is refused (`protocol`); aiohttp's parser bounds
# what it reads before that to MAX_HEADER_LINE bytes a line and MAX_HEADERS lines.
MAX_HEAD_BYTES = 65536
MAX_HEADER_LINE = 8190
MAX_HEADERS = 128
USER_AGENT = "a2a-platform-webhooks/1"
# Idle keep-alive connections are reused for this long.
KEEPALIVE_SECONDS = 5.0
RESOLVER_THREADS = 32

# Set by the transport, whatever the caller passes.
_OURS = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
_OURS_LOWER = {name.lower() for name in _OURS}
# Framed by the client from the URL and the body.
_FRAMING = {"host", "content-length", "transfer-encoding"}
# Hop-by-hop (RFC 9110 §7.6.1): about this connection, which the client manages.
_HOP_BY_HOP = {"connection", "keep-alive", "te", "trailer", "upgrade", "expect"}
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_VALUE = re.compile(r"^[\x20-\x7e\t]*$")


@dataclass(frozen=True)
class TransportResult:
    status: int | None
    headers: dict[str, str]
    body_excerpt: str
    duration_ms: float
    error_class: str | None
    retry_after: float | None
    # A short human explanation of `error_class`, plain words first ("connection refused",
    # "certificate has expired", "timed out after 10 s"), then the technical reason; never
    # the URL's path or query. `failure_detail` adds the HTTP status of a refused answer.
    error_detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class PostRequest(NamedTuple):
    url: str
    body: bytes | str
    headers: Mapping[str, str]
    # The OpenTelemetry context the send runs in (the delivery attempt's span): the aiohttp
    # client instrumentation's span is its child. None: none (spans not exported).
    trace: Any = None


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


def request_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The headers a request goes out with, Host and Content-Length aside (the client adds
    those from the checked URL and the body). ValueError for a name that is not a token, a
    value that is not printable ASCII, a name given twice in any letter case, or a name that
    belongs to the transport."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if not _TOKEN.match(name):
            raise ValueError(f"{name!r} is not a valid header name")
        lower = name.lower()
        if lower in _FRAMING or lower in _HOP_BY_HOP or lower in _OURS_LOWER:
            raise ValueError(f"the {name} header is set by the transport")
        if lower in out:
            raise ValueError(f"the {name} header is given twice")
        if not _VALUE.match(value):
            raise ValueError(f"the {name} header's value is not printable ASCII")
        out[name] = value
    out.extend(_OURS)
    return out


# --- the sender loop ----------------------------------------------------------------------


class _Sender:
    """An event loop on a daemon thread, with its aiohttp session (made on the loop)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        # uvloop (libuv), as the web process runs on: a third less CPU per send than asyncio's
        # own loop (bench/transport_bench.py).
        self.loop = uvloop.new_event_loop()
        # Name resolution blocks a thread per lookup; enough of them that a few receivers
        # whose DNS hangs cannot hold up every other receiver's lookups.
        self.resolver_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=RESOLVER_THREADS, thread_name_prefix="webhook-dns"
        )
        self.session: aiohttp.ClientSession | None = None
        self.thread = threading.Thread(target=self._run, name="webhook-sender", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, fn, *args, **kwargs) -> None:
        self.loop.call_soon_threadsafe(functools.partial(fn, self, *args, **kwargs))

    def client(self) -> aiohttp.ClientSession:
        """The session (on the loop thread only)."""
        if self.session is None or self.session.closed:
            tracing = aiohttp.TraceConfig()
            tracing.on_connection_reuseconn.append(_note_reuse)
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    resolver=_CheckingResolver(self.loop, self.resolver_pool),
                    # Every new connection asks the resolver, which checks the answer.
                    use_dns_cache=False,
                    limit=0,  # the pump's window and the endpoint caps bound concurrency
                    keepalive_timeout=KEEPALIVE_SECONDS,
                ),
                timeout=aiohttp.ClientTimeout(total=None),  # our deadline (asyncio.timeout)
                trust_env=False,
                auto_decompress=False,
                skip_auto_headers=("Accept", "Content-Type"),
                max_line_size=MAX_HEADER_LINE,
                max_field_size=MAX_HEADER_LINE,
                max_headers=MAX_HEADERS,
                trace_configs=[tracing],
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self.session

    async def close_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.close()


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
        attempt = _attempt(sender, request, timeout)
        if request.trace is not None:
            attempt = within_context(request.trace, attempt)
        task = sender.loop.create_task(attempt)
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


# --- the connect-time check ------------------------------------------------------------------

# The target of the request being sent, for the resolver: aiohttp resolves inside the
# request's task, so the task's context carries it (each send is a task of its own).
_target: contextvars.ContextVar[ParsedTarget] = contextvars.ContextVar("webhook_target")


class _CheckingResolver(AbstractResolver):
    """Resolves on the sender's resolver threads and refuses (UnsafeDestination, which aiohttp
    lets through unwrapped) unless every address passes the SSRF policy for the request."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool) -> None:
        self.loop = loop
        self.pool = pool

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        target = _target.get()
        if host != target.host:  # never resolve a name the URL check did not see
            raise UnsafeDestination("host", f"{host!r} is not the checked host")
        addresses = await self.loop.run_in_executor(self.pool, ssrf.resolve, host, port)
        try:
            ssrf.check_addresses(target, addresses)
        except UnsafeDestination as exc:
            logger.warning(
                "webhook connect refused",
                extra={"host": host, "addresses": addresses, "reason": exc.reason},
            )
            raise
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        return None


async def _note_reuse(session, context, params) -> None:
    context.trace_request_ctx.reused = True


# --- one attempt ----------------------------------------------------------------------------


async def _attempt(sender: _Sender, request: PostRequest, timeout: float) -> TransportResult:
    started = time.perf_counter()
    body = request.body.encode("utf-8") if isinstance(request.body, str) else request.body
    try:
        async with asyncio.timeout(timeout):
            target = ssrf.parse_url(request.url)
            if target.literal:
                ssrf.check_addresses(target, [target.host])
            url = _url(target)
            headers = request_headers(request.headers)
            tls = _tls_context(settings.A2A_WEBHOOK_CA_BUNDLE) if target.scheme == "https" else None
            _target.set(target)
            response = await _send(sender.client(), url, body, headers, tls)
        # The status line is the receiver's answer: a body that breaks or stalls afterwards
        # is noted on the result, not turned into a failure.
        excerpt, detail = await _read_excerpt(response, deadline=started + timeout)
        answer = {name.lower(): value for name, value in response.headers.items()}
        return TransportResult(
            status=response.status,
            headers=answer,
            body_excerpt=_decode(excerpt, response.charset),
            duration_ms=_elapsed_ms(started),
            error_class=None,
            retry_after=parse_retry_after(answer.get("retry-after")),
            error_detail=detail,
        )
    except UnsafeDestination as exc:
        if exc.reason == "unresolvable":
            return _failure("dns", f"name does not resolve ({exc})", started)
        return _failure("ssrf", f"destination refused: {exc}", started)
    except _BadBundle as exc:
        return _failure("tls", str(exc), started)
    except TimeoutError:
        return _failure("timeout", f"timed out after {timeout:g} s", started)
    except aiohttp.ClientSSLError as exc:
        return _failure("tls", _reason(exc), started)
    except aiohttp.ClientConnectorError as exc:
        return _failure("connect", _reason(exc), started)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        return _failure("network", _reason(exc), started)
    except aiohttp.ClientResponseError as exc:
        return _failure("protocol", f"malformed HTTP response: {exc.message}", started)
    except (UnicodeError, ValueError) as exc:
        return _failure("request", f"{type(exc).__name__}: {exc}", started)
    except OSError as exc:
        return _failure("network", f"{type(exc).__name__}: {exc}", started)


async def _send(
    session: aiohttp.ClientSession,
    url: yarl.URL,
    body: bytes,
    headers: CIMultiDict[str],
    tls: ssl.SSLContext | None,
) -> aiohttp.ClientResponse:
    """The response, its head read. A kept-alive connection the receiver closed while idle,
    before a byte of the answer (the usual keep-alive race, not a failing endpoint), is tried
    once more on another connection: a delivery is at-least-once, its webhook-id dedupes."""
    for last_try in (False, True):
        reuse = SimpleNamespace(reused=False)
        try:
            response = await session.post(
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                ssl=tls if tls is not None else True,
                trace_request_ctx=reuse,
            )
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if last_try or not reuse.reused or isinstance(exc, aiohttp.ClientConnectorError):
                raise
            continue
        if _head_bytes(response) > MAX_HEAD_BYTES:
            response.close()
            raise aiohttp.ClientResponseError(
                response.request_info,
                (),
                message=f"response head longer than {MAX_HEAD_BYTES} bytes",
            )
        return response
    raise AssertionError("unreachable")


def _head_bytes(response: aiohttp.ClientResponse) -> int:
    return (
        len(response.reason or "") + 15 + sum(len(k) + len(v) + 4 for k, v in response.raw_headers)
    )


async def _read_excerpt(
    response: aiohttp.ClientResponse, *, deadline: float
) -> tuple[bytes, str | None]:
    """The body up to EXCERPT_BYTES, and a note when it broke or stalled. The connection goes
    back to the pool only when the whole body was read."""
    excerpt = bytearray()
    detail = None
    try:
        async with asyncio.timeout(max(0.0, deadline - time.perf_counter())):
            while len(excerpt) < EXCERPT_BYTES:
                chunk = await response.content.read(EXCERPT_BYTES - len(excerpt))
                if not chunk:
                    break
                excerpt += chunk
    except TimeoutError:
        detail = "response body: timeout"
    except (aiohttp.ClientError, OSError) as exc:
        detail = f"response body: {_reason(exc)}"
    if detail is None and response.content.at_eof():
        response.release()
    else:
        response.close()
    return bytes(excerpt), detail


def _url(target: ParsedTarget) -> yarl.URL:
    """The request URL, built from the checked parts alone (so no second parser reads
    another host): the path and query are already percent-encoded."""
    path, _, query = target.path_qs.partition("?")
    host = f"[{target.host}]" if ":" in target.host else target.host
    return yarl.URL.build(
        scheme=target.scheme,
        host=host,
        port=target.port,
        path=path,
        query_string=query,
        encoded=True,
    )


class _BadBundle(Exception):
    """A2A_WEBHOOK_CA_BUNDLE names no readable PEM bundle."""


def _tls_context(ca_bundle: str) -> ssl.SSLContext:
    """Certificates checked against `ca_bundle` (a PEM file) or, when empty, the system's
    trust store; host names checked; TLS 1.2 at least. Built once per version of the bundle
    file, so a bundle replaced on disk (a rotated mount) is trusted from the next new
    connection on."""
    if not ca_bundle:
        return _context_for(None, None)
    try:
        stat = os.stat(ca_bundle)
    except OSError as exc:
        raise _BadBundle(f"A2A_WEBHOOK_CA_BUNDLE={ca_bundle!r} cannot be read: {exc}") from None
    return _context_for(ca_bundle, (stat.st_mtime_ns, stat.st_size, stat.st_ino))


@functools.lru_cache(maxsize=8)
def _context_for(ca_bundle: str | None, version: tuple[int, int, int] | None) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise _BadBundle(
            f"A2A_WEBHOOK_CA_BUNDLE={ca_bundle!r} cannot be read as PEM CA certificates: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def _reason(exc: BaseException) -> str:
    """What went wrong, plain words first when we know them, then the exception's own text;
    without the URL (whose path or query may hold a secret)."""
    cause = exc.__cause__ or getattr(exc, "os_error", None) or exc
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cause = exc.certificate_error
    text = str(cause) if not isinstance(cause, aiohttp.ClientConnectorError) else cause.strerror
    technical = f"{type(cause).__name__}: {text}"
    plain = _plain_words(cause)
    return f"{plain} ({technical})" if plain else technical


def _plain_words(cause: BaseException) -> str | None:
    """An operator's words for the failures a receiver usually causes (what Svix and Stripe
    dashboards show), or None to show the exception's text alone."""
    if isinstance(cause, ssl.SSLCertVerificationError) and cause.verify_message:
        return cause.verify_message  # "certificate has expired", "self-signed certificate"
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, ConnectionResetError):
        return "connection reset by the receiver"
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        return "the receiver closed the connection without answering"
    if isinstance(cause, socket.gaierror):
        return "name does not resolve"
    if isinstance(cause, OSError) and cause.errno in _ERRNO_WORDS:
        return _ERRNO_WORDS[cause.errno]
    return None


_ERRNO_WORDS = {
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ECONNABORTED: "connection aborted",
    errno.EPIPE: "the receiver closed the connection while we were sending",
}


def failure_detail(result: TransportResult) -> str:
    """What an attempt's row keeps as its human-readable reason: the transport's detail, or
    for an answer that is not 2xx its status ("HTTP 503 Service Unavailable from the
    receiver"), with the transport's note on the body when it broke. Empty for a success
    without a note. Never the URL, the headers or the body (the receiver's or ours)."""
    parts = []
    if result.status is not None and not result.ok:
        try:
            phrase = f" {HTTPStatus(result.status).phrase}"
        except ValueError:
            phrase = ""
        parts.append(f"HTTP {result.status}{phrase} from the receiver")
    if result.error_detail:
        parts.append(result.error_detail)
    return "; ".join(parts)[:300]


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
