import pytest

from tasks.executors.scripted import MAX_SECONDS, Step, parse_script


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("work 3", [Step("work", 3)]),
        ("work 2; chunks 4; ask", [Step("work", 2), Step("chunks", 4), Step("ask")]),
        ("  FAIL ", [Step("fail")]),
        ("message", [Step("message")]),
        ("work 99999", None),
        ("hello world", None),
        ("ask; hello", None),
        ("", None),
    ],
)
def test_parse_script(text, steps):
    assert parse_script(text) == steps


def test_parse_script_caps_durations():
    assert parse_script("work 9999") == [Step("work", MAX_SECONDS)]
