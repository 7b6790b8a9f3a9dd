"""The delivery transport: one POST, returned as a value (STYLE.md "Delivery").

`post` never raises for a network or HTTP problem: it returns a `TransportResult` whose
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
- `internal` a bug in this module, caught by `post_guarded` (logged).

SSRF is enforced inside the transport, not only before it: the httpcore network backend
resolves the host at connect time, checks every address and connects to a checked address,
so a DNS answer that changes between `check_url` and the connection (rebinding) is refused.
Redirects are never followed; a 3xx is returned as is.

`timeout` is a deadline for the whole attempt (connect + TLS + send + response head + body
excerpt), not per socket operation, so a receiver that trickles bytes cannot hold a worker.
DNS resolution is the exception: it is bounded by the system resolver's own timeouts.
"""

from __future__ import annotations

import logging
import math
import os
import re
import ssl
import threading
import time
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple

import httpcore
import httpx

from webhooks import ssrf
from webhooks.ssrf import UnsafeDestination, check_url

logger = logging.getLogger(__name__)

EXCERPT_BYTES = 2048
USER_AGENT = "a2a-platform-webhooks/1"


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


# --- the deadline --------------------------------------------------------------------------

# Monotonic deadline of the attempt running in this thread; the network stream reads it so
# every socket operation gets only what is left of the attempt's budget.
_DEADLINE: ContextVar[float | None] = ContextVar("webhook_deadline", default=None)


def _budget(timeout: float | None, exc: type[Exception]) -> float | None:
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise exc("the delivery timeout elapsed")
    return remaining if timeout is None else min(timeout, remaining)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _budget(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _budget(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        tls = self._inner.start_tls(
            ssl_context, server_hostname, _budget(timeout, httpcore.ConnectTimeout)
        )
        return _DeadlineStream(tls)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


# --- the SSRF-checked connect --------------------------------------------------------------


class _ResolutionFailed(httpcore.ConnectError):
    pass


class SSRFSafeBackend(httpcore.SyncBackend):
    """Resolve, check every address, connect to a checked address (never to the name).

    httpcore still sends the original host name as TLS SNI and the URL's Host header, so
    certificates and virtual hosts work as usual.
    """

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = ssrf.resolve(host, port)
        except UnsafeDestination as exc:
            raise _ResolutionFailed(str(exc)) from None
        for address in addresses:
            try:
                ssrf.check_address(address)
            except UnsafeDestination as exc:
                logger.warning(
                    "webhook connect refused",
                    extra={"host": host, "address": address, "reason": exc.reason},
                )
                raise
        last: Exception | None = None
        for address in addresses:
            try:
                stream = super().connect_tcp(
                    address,
                    port,
                    timeout=_budget(timeout, httpcore.ConnectTimeout),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
                continue
            return _DeadlineStream(stream)
        assert last is not None
        raise last


# --- the connection pool --------------------------------------------------------------------
#
# httpcore directly, not an httpx.Client over it: the delivery pump sends hundreds of requests
# a second, and httpx's request/response models, cookie jar and URL handling cost as much CPU
# as httpcore and h11 together (measured with bench/delivery_bench.py). No proxies: a proxy
# would make the connection, and the check would be about the proxy, not the receiver.

_pool_lock = threading.Lock()
_pool: httpcore.ConnectionPool | None = None
_pool_pid: int | None = None

_FIXED_HEADERS = [
    (b"User-Agent", USER_AGENT.encode()),
    # identity: the excerpt is 2 KB, never decompress (a small gzip can be huge).
    (b"Accept-Encoding", b"identity"),
]


def connection_pool(*, verify: ssl.SSLContext | bool = True) -> httpcore.ConnectionPool:
    """An HTTP/1.1 pool whose every new connection goes through `SSRFSafeBackend`."""
    ssl_context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify)
    return httpcore.ConnectionPool(
        ssl_context=ssl_context,
        max_connections=200,
        max_keepalive_connections=64,
        keepalive_expiry=5.0,
        http1=True,
        http2=False,
        network_backend=SSRFSafeBackend(),
    )


def _get_pool() -> httpcore.ConnectionPool:
    """One pool per process (thread-safe); a forked child builds its own."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = connection_pool()
            _pool_pid = os.getpid()
        return _pool


def close_client() -> None:
    """Close the process's pool (worker shutdown, tests)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is not None and _pool_pid == os.getpid():
            _pool.close()
        _pool, _pool_pid = None, None


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


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _classify_connect(exc: httpcore.ConnectError) -> str:
    for link in _chain(exc):
        if isinstance(link, _ResolutionFailed):
            return "dns"
        if isinstance(link, ssl.SSLError | ssl.CertificateError):
            return "tls"
    return "connect"


def post(
    url: str, body: bytes | str, headers: Mapping[str, str], *, timeout: float
) -> TransportResult:
    """POST `body` (str is sent as UTF-8) to `url`; never follows redirects, never raises for
    network or HTTP problems. `timeout` bounds the whole attempt."""
    started = time.perf_counter()
    content = body.encode("utf-8") if isinstance(body, str) else body
    token = _DEADLINE.set(time.monotonic() + timeout)
    try:
        target = check_url(url)
        request_headers = _FIXED_HEADERS + [
            (name.encode("ascii"), value.encode("ascii")) for name, value in headers.items()
        ]
        limits = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        with _get_pool().stream(
            "POST",
            target.url,
            headers=request_headers,
            content=content,
            extensions={"timeout": limits},
        ) as response:
            answer = {
                key.decode("latin-1").lower(): value.decode("latin-1")
                for key, value in response.headers
            }
            excerpt, detail = _read_excerpt(response)
            return TransportResult(
                status=response.status,
                headers=answer,
                body_excerpt=_decode(excerpt, _charset(answer.get("content-type"))),
                duration_ms=_elapsed_ms(started),
                error_class=None,
                retry_after=parse_retry_after(answer.get("retry-after")),
                error_detail=detail,
            )
    except UnsafeDestination as exc:
        return _failure("dns" if exc.reason == "unresolvable" else "ssrf", str(exc), started)
    except httpcore.TimeoutException as exc:
        return _failure("timeout", f"{type(exc).__name__}: {exc}", started)
    except httpcore.ConnectError as exc:
        return _failure(_classify_connect(exc), str(exc), started)
    except httpcore.ProtocolError as exc:
        return _failure("protocol", f"{type(exc).__name__}: {exc}", started)
    except httpcore.NetworkError as exc:
        return _failure("network", f"{type(exc).__name__}: {exc}", started)
    except (httpcore.UnsupportedProtocol, UnicodeError, ValueError) as exc:
        return _failure("request", f"{type(exc).__name__}: {exc}", started)
    except OSError as exc:
        return _failure("network", f"{type(exc).__name__}: {exc}", started)
    finally:
        _DEADLINE.reset(token)


_CHARSET = re.compile(r"charset\s*=\s*\"?([A-Za-z0-9._-]{1,40})", re.IGNORECASE)


def _charset(content_type: str | None) -> str | None:
    match = _CHARSET.search(content_type or "")
    return match.group(1) if match else None


def _read_excerpt(response: httpcore.Response) -> tuple[bytes, str | None]:
    """The first EXCERPT_BYTES of the body. The status line is the receiver's answer, so a
    body that breaks or stalls afterwards is noted, not turned into a failure."""
    excerpt = b""
    try:
        for chunk in response.iter_stream():
            excerpt += chunk
            if len(excerpt) >= EXCERPT_BYTES:
                break
    except (
        httpcore.TimeoutException,
        httpcore.NetworkError,
        httpcore.ProtocolError,
        OSError,
    ) as exc:
        return excerpt[:EXCERPT_BYTES], f"response body: {type(exc).__name__}"
    return excerpt[:EXCERPT_BYTES], None


def post_guarded(request: PostRequest, timeout: float) -> TransportResult:
    """`post`, with a bug in this module turned into an `internal` result (logged): the
    delivery pump sends many at once and must get a result for each."""
    started = time.perf_counter()
    try:
        return post(request.url, request.body, request.headers, timeout=timeout)
    except Exception as exc:
        logger.exception("webhook post failed unexpectedly")
        return _failure("internal", f"{type(exc).__name__}: {exc}", started)
