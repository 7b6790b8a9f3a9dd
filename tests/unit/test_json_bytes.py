"""The JSON bytes the protocol answers with and the task store writes its rows in
(a2a_platform/lib/json_bytes.dumps): the JSON the standard library writes compactly in UTF-8,
to the byte but for how a float is spelled (1e-7 for its 1e-07, the same number); timestamps
and UUIDs spelled alike whichever library writes them."""

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from a2a_platform.lib.json_bytes import dumps


def standard(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


# Text with what JSON escapes (controls, quotes, backslashes) and what it need not (non-ASCII,
# the line separators JavaScript once refused, an astral character).
text = st.text(alphabet=list('az"\\/\x00\x01\x1f\x7f\n\t é\u2028\u2029\U0001f600'), max_size=12)


def json_values(*scalars):
    return st.recursive(
        st.one_of(st.none(), st.booleans(), text, *scalars),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=12,
    )


integers = st.integers(min_value=-(2**70), max_value=2**70)
floats = st.floats(allow_nan=False, allow_infinity=False)


@given(json_values(integers))
@example({"n": 2**64, "m": -(2**63) - 1})  # past 64 bits: the standard library writes it
@example({1: "one", None: "none", False: "no"})  # keys that are not text
def test_the_bytes_are_the_standard_librarys(value):
    assert dumps(value) == standard(value)


@given(json_values(integers, floats))
@example([1e16, 1e-7, -0.0, 0.1, 123456789.0, 5e-324, 1.7976931348623157e308])
@example({2.5: "a float key"})
def test_with_floats_the_json_is_the_standard_librarys_number_for_number(value):
    ours, theirs = json.loads(dumps(value)), json.loads(standard(value))
    assert ours == theirs
    assert repr(ours) == repr(theirs)  # -0.0 stays -0.0


def test_text_no_utf_8_can_carry_is_refused_as_the_standard_library_refuses_it():
    with pytest.raises(UnicodeEncodeError):
        standard({"text": "\ud800"})
    with pytest.raises(UnicodeEncodeError):
        dumps({"text": "\ud800"})


@pytest.mark.parametrize(
    "stamp",
    [
        datetime(2026, 12, 5, 1, 2, 3, 456789, tzinfo=UTC),
        datetime(2026, 12, 5, 1, 2, 3, tzinfo=UTC),  # no microseconds: none written
        datetime(1970, 1, 1, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
    ],
)
def test_timestamps_and_uuids_are_spelled_alike_by_either_library(stamp):
    key = uuid.UUID("12345678-1234-5678-1234-567812345678")
    fast = json.loads(dumps({"t": stamp, "u": key}))  # orjson
    fallback = json.loads(dumps({"t": stamp, "u": key, "big": 2**70}))  # the standard library
    assert fast == {"t": stamp.isoformat(), "u": str(key)}
    assert fallback == {**fast, "big": 2**70}
