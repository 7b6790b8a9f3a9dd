"""webhooks.delivery.transport values that need no network: Retry-After parsing, `ok`, the request
URL built from the checked parts of a URL, and the request headers (each name once, ours ours)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from webhooks.delivery.ssrf import ParsedTarget
from webhooks.delivery.transport import (
    USER_AGENT,
    TransportResult,
    _url,
    parse_retry_after,
    request_headers,
)

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
    ("target", "url", "host_header"),
    [
        (
            ParsedTarget("http", "127.0.0.1", 8080, "/hook?a=1&b=%2F", literal=True),
            "http://127.0.0.1:8080/hook?a=1&b=%2F",
            "127.0.0.1:8080",
        ),
        (
            ParsedTarget("https", "2001:4860:4860::8888", 8443, "/", literal=True),
            "https://[2001:4860:4860::8888]:8443/",
            "[2001:4860:4860::8888]:8443",
        ),
        (
            ParsedTarget("https", "public.test", 443, "/a/b%20c?c=d"),
            "https://public.test/a/b%20c?c=d",
            "public.test",
        ),
    ],
    ids=["port", "ipv6", "default-port"],
)
def test_the_request_url_comes_from_the_checked_parts(target, url, host_header):
    built = _url(target)
    assert str(built) == url
    assert built.raw_host == target.host  # what the resolver is asked for, and SNI
    assert built.host_port_subcomponent == host_header  # what the Host header says


# What a delivery sends (webhooks/delivery/claim_record.py), with a token and credentials.
DELIVERY_HEADERS = {
    "Content-Type": "application/a2a+json",
    "X-A2A-Task-Id": "t-1",
    "X-A2A-Task-Seq": "3",
    "X-A2A-Binding-Version": "cfg.v1",
    "X-A2A-Event-Kind": "status",
    "webhook-id": "e-1",
    "webhook-timestamp": "1700000000",
    "webhook-signature": "v1a,AAAA v1a,BBBB",
    "X-A2A-Notification-Token": "tok",
    "Authorization": "Bearer a.b.c",
}


def test_request_headers_add_ours_once_and_keep_the_callers():
    out = request_headers(DELIVERY_HEADERS)
    names = [name.lower() for name in out]
    assert len(names) == len(set(names)), f"a header twice: {names}"
    assert {name: out[name] for name in DELIVERY_HEADERS} == DELIVERY_HEADERS
    assert out["User-Agent"] == USER_AGENT
    assert out["Accept-Encoding"] == "identity"  # the excerpt is 2 KB: never decompress
    assert set(names) == {n.lower() for n in DELIVERY_HEADERS} | {"user-agent", "accept-encoding"}


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"User-Agent": "mine/1"}, "set by the transport"),
        ({"user-agent": "mine/1"}, "set by the transport"),
        ({"Accept-Encoding": "gzip"}, "set by the transport"),
        ({"Host": "elsewhere.test"}, "set by the transport"),
        ({"content-length": "0"}, "set by the transport"),
        ({"Transfer-Encoding": "chunked"}, "set by the transport"),
        ({"Connection": "close"}, "set by the transport"),
        ({"Expect": "100-continue"}, "set by the transport"),
        ({"X-Token": "a", "x-token": "b"}, "given twice"),
        ({"Authorization": "a", "AUTHORIZATION": "b"}, "given twice"),
        ({"Bad Name": "x"}, "not a valid header name"),
        ({"X-Token": "a\r\nX-Injected: 1"}, "not printable ASCII"),
        ({"X-Token": "caf\u00e9"}, "not printable ASCII"),
    ],
)
def test_request_headers_refuse_duplicates_ours_and_injection(headers, message):
    with pytest.raises(ValueError, match=message):
        request_headers(headers)
