"""webhooks.transport values that need no network: Retry-After parsing, `ok`, the request
head built from the checked parts of a URL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from webhooks.ssrf import ParsedTarget
from webhooks.transport import TransportResult, _request_head, parse_retry_after

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("Thu, 01 Jan 2026 12:02:00 GMT", 120.0),
        ("Thursday, 01-Jan-26 12:00:30 GMT", 30.0),  # RFC 850, still accepted by RFC 9110
        ("Thu Jan  1 12:01:00 2026", 60.0),  # asctime
        ("Thu, 01 Jan 2026 11:00:00 GMT", 0.0),  # in the past
        (None, None),
        ("", None),
        ("-5", None),
        ("soon", None),
        ("1e3", None),
        ("9" * 400, None),
    ],
)
def test_parse_retry_after(value, seconds):
    assert parse_retry_after(value, now=NOW) == seconds


@pytest.mark.parametrize(
    ("status", "ok"),
    [(200, True), (204, True), (299, True), (302, False), (500, False), (None, False)],
)
def test_transport_result_ok(status, ok):
    result = TransportResult(
        status=status,
        headers={},
        body_excerpt="",
        duration_ms=1.0,
        error_class=None if status else "connect",
        retry_after=None,
    )
    assert result.ok is ok


@pytest.mark.parametrize(
    ("target", "start"),
    [
        (
            ParsedTarget("http", "127.0.0.1", 8080, "/hook?a=1&b=2", literal=True),
            "POST /hook?a=1&b=2 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n",
        ),
        (
            ParsedTarget("https", "2001:4860:4860::8888", 8443, "/", literal=True),
            "POST / HTTP/1.1\r\nHost: [2001:4860:4860::8888]:8443\r\n",
        ),
        (
            ParsedTarget("https", "public.test", 443, "/a/b?c=d"),
            "POST /a/b?c=d HTTP/1.1\r\nHost: public.test\r\n",
        ),
    ],
    ids=["port", "ipv6", "default-port"],
)
def test_the_request_head_comes_from_the_checked_parts(target, start):
    head = _request_head(target, {"Content-Type": "application/a2a+json"}, 12).decode()
    assert head.startswith(start)
    assert "\r\nContent-Length: 12\r\n" in head
    assert head.endswith("\r\nContent-Type: application/a2a+json\r\n\r\n")
