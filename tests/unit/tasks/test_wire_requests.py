"""Requests parsed from ProtoJSON (tasks/wire.parse_dict): every request gives what the
request's JSON text gives to protobuf's reference ProtoJSON parser, with unknown fields ignored
(spec §5.7) and nothing else relaxed; flat requests are built without that parser."""

import json

import pytest
from a2a.types import a2a_pb2
from google.protobuf import json_format
from hypothesis import example, given
from hypothesis import strategies as st

from tasks import wire

REQUESTS = [
    a2a_pb2.GetTaskRequest,
    a2a_pb2.CancelTaskRequest,
    a2a_pb2.ListTasksRequest,
    a2a_pb2.SubscribeToTaskRequest,
    a2a_pb2.GetTaskPushNotificationConfigRequest,
    a2a_pb2.ListTaskPushNotificationConfigsRequest,
]


# What parse_dict may raise (its docstring); anything else is a bug, not a refusal.
REFUSALS = (json_format.ParseError, ValueError, TypeError)


def protojson(data: dict, proto_cls):
    """The oracle, independent of tasks/wire.py: the request as a client sends it (JSON text,
    written by the stdlib's json), less the keys that name no field of the request (unknown
    fields are ignored, spec §5.7), read by protobuf's reference parser, strictly: an unknown
    enum value is refused, wherever it stands among the keys."""
    fields = proto_cls.DESCRIPTOR.fields
    known = {f.json_name for f in fields} | {f.name for f in fields}
    text = json.dumps({k: v for k, v in data.items() if k in known})
    return json_format.Parse(text, proto_cls())


def outcome(parse, data, proto_cls):
    try:
        message = parse(data, proto_cls)
    except REFUSALS:
        return ("refused",)
    return "parsed", message.SerializeToString(deterministic=True), message.ListFields()


def names(proto_cls) -> list[str]:
    fields = proto_cls.DESCRIPTOR.fields
    return [f.json_name for f in fields] + [f.name for f in fields] + ["unknownField"]


values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 0, 1, -1]),
    st.floats(allow_nan=False),
    st.text(alphabet="ab-é\u2028 5", max_size=8),
    st.sampled_from(["\ud800", "a\x00b", "TASK_STATE_WORKING", "5", "true"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["a", "id"]), st.integers(), max_size=2),
)


@st.composite
def requests(draw):
    proto_cls = draw(st.sampled_from(REQUESTS))
    data = draw(st.dictionaries(st.sampled_from(names(proto_cls)), values, max_size=4))
    return proto_cls, data


@given(requests())
@example((a2a_pb2.ListTasksRequest, {"includeArtifacts": 1}))  # a number is not a boolean
@example((a2a_pb2.ListTasksRequest, {"pageSize": True}))  # nor a boolean a number
@example((a2a_pb2.GetTaskRequest, {"historyLength": 2**31}))  # out of int32's range
@example((a2a_pb2.GetTaskRequest, {"historyLength": 1.0}))  # a whole float is a number
@example((a2a_pb2.GetTaskRequest, {"historyLength": "5"}))  # and so is its text
@example((a2a_pb2.GetTaskRequest, {"id": None, "tenant": 5}))
@example((a2a_pb2.GetTaskRequest, {"id": "\ud800"}))  # text protobuf refuses
@example((a2a_pb2.GetTaskRequest, {"id": "a", "history_length": 3, "historyLength": 3}))
@example((a2a_pb2.GetTaskRequest, {"id": "t-1", "unknownField": 1}))  # ignored
@example((a2a_pb2.ListTasksRequest, {"status": "ab", "unknownField": 1}))  # an unknown enum
@example((a2a_pb2.ListTasksRequest, {"unknownField": 1, "status": "ab"}))  # after one too
@example((a2a_pb2.ListTasksRequest, {"status": float("inf")}))  # JSON's 1e400: refused
@example((a2a_pb2.ListTasksRequest, {"status": "\ud800"}))  # text protobuf refuses
def test_a_request_parses_as_protobufs_json_parser_parses_its_json_text(case):
    proto_cls, data = case
    assert outcome(wire.parse_dict, data, proto_cls) == outcome(protojson, data, proto_cls)


def test_gettask_is_built_without_the_json_parser_and_anything_else_goes_through_it(
    monkeypatch,
):
    def refuse(*args, **kwargs):
        raise AssertionError("protobuf's JSON parser was called")

    monkeypatch.setattr(wire.json_format, "ParseDict", refuse)
    request = wire.parse_dict(
        {"id": "t-1", "historyLength": 0, "tenant": "acme"}, a2a_pb2.GetTaskRequest
    )
    assert (request.id, request.tenant, request.history_length) == ("t-1", "acme", 0)
    assert request.HasField("history_length")
    for data in (
        {"id": 5},  # the parser words the error
        {"id": "t-1", "historyLength": True},  # a bool is not a number
        {"id": "t-1", "historyLength": 2**31},  # out of int32's range
        {"id": "t-1", "history_length": 1, "historyLength": 1},  # one field twice
        {"id": "\ud800"},  # text protobuf refuses
        {"id": "t-1", "unknownField": 1},  # ignored by the parser, not here
    ):
        with pytest.raises(AssertionError, match="JSON parser was called"):
            wire.parse_dict(data, a2a_pb2.GetTaskRequest)


@pytest.mark.parametrize(
    "message",
    [
        {"unknownField": 1, "role": "ROLE_USRE", "messageId": "m", "parts": [{"text": "hi"}]},
        {"role": "ROLE_USER", "messageId": "m", "parts": [{"unknown": 1, "text": 5}]},
    ],
)
def test_an_unknown_field_beside_a_bad_value_at_depth_does_not_hide_it(message):
    """Unknown fields are ignored at every depth, but what stands beside them is still judged
    strictly: a misspelt enum after an unknown key, a number for a text part."""
    with pytest.raises(REFUSALS):
        wire.parse_dict({"message": message, "extra": True}, a2a_pb2.SendMessageRequest)


def test_unknown_fields_at_every_depth_are_ignored():
    message = {"role": "ROLE_USER", "messageId": "m", "parts": [{"text": "hi", "x": 1}], "y": 2}
    parsed = wire.parse_dict({"message": message, "z": 3}, a2a_pb2.SendMessageRequest)
    assert parsed.message.parts[0].text == "hi"
    assert parsed.message.role == a2a_pb2.ROLE_USER
