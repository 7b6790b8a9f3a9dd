"""The wire's timestamps (spec §5.6.1): ISO 8601 in UTC, milliseconds, a `Z`."""

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from tasks.wire import timestamp_json


def test_a_timestamp_is_utc_with_milliseconds_truncated_and_a_z():
    paris = timezone(timedelta(hours=2))
    assert timestamp_json(datetime(2026, 1, 2, 3, 4, 5, 678999, tzinfo=UTC)) == (
        "2026-01-02T03:04:05.678Z"
    )
    assert timestamp_json(datetime(2026, 1, 2, 3, 4, 5, tzinfo=paris)) == (
        "2026-01-02T01:04:05.000Z"
    )
    assert timestamp_json(datetime(999, 1, 1, tzinfo=UTC)) == "0999-01-01T00:00:00.000Z"


@given(st.datetimes(timezones=st.just(UTC)))
def test_a_timestamp_reads_back_as_the_instant_to_the_millisecond(value):
    text = timestamp_json(value)
    assert text.endswith("Z")
    assert len(text) == len("2026-01-02T03:04:05.678Z")
    back = datetime.fromisoformat(text.removesuffix("Z") + "+00:00")
    assert back == value.replace(microsecond=value.microsecond // 1000 * 1000)
