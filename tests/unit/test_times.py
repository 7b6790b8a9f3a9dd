"""The console's one time format (a2a_platform/lib/times.py): UTC to the second with a
relative hint, the date only when it is not today's, in a <time> element."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from a2a_platform.lib.times import relative, when, when_text

NOW = datetime(2026, 12, 6, 23, 50, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    ("ago", "hint"),
    [
        (timedelta(seconds=0), "0 s ago"),
        (timedelta(seconds=59), "59 s ago"),
        (timedelta(minutes=2, seconds=30), "2 min ago"),
        (timedelta(hours=3, minutes=59), "3 h ago"),
        (timedelta(days=3), "3 d ago"),
        (timedelta(minutes=-15), "in 15 min"),
    ],
)
def test_relative_one_unit_rounded_down(ago, hint):
    assert relative(NOW - ago, NOW) == hint


def test_when_text_today_is_the_time_in_utc_without_microseconds():
    at = datetime(2026, 12, 7, 0, 44, 46, 999999, tzinfo=timezone(timedelta(hours=1)))
    assert when_text(at, now=NOW) == "23:44:46 UTC · 5 min ago"


def test_when_text_another_day_leads_with_the_date():
    assert when_text(NOW - timedelta(days=2), now=NOW) == "2026-12-04 23:50:00 UTC · 2 d ago"


def test_when_text_reads_iso_strings_as_the_dashboard_json_carries_them():
    assert when_text("2026-12-06T23:48:59.5+00:00", now=NOW) == "23:48:59 UTC · 1 min ago"


def test_when_is_a_time_element_with_the_instant():
    html = when(NOW - timedelta(minutes=1), now=NOW)
    assert html == (
        '<time class="a2a-time" datetime="2026-12-06T23:49:00Z" title="2026-12-06T23:49:00Z">'
        "<span>23:49:00 UTC</span> · <span>1 min ago</span></time>"
    )


@pytest.mark.parametrize("empty", [None, ""])
def test_when_of_nothing_is_a_dash(empty):
    assert when(empty) == when_text(empty) == "–"
