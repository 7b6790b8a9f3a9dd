"""webhooks.transport values that need no network: Retry-After parsing, `ok`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from webhooks.transport import TransportResult, parse_retry_after

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
