"""The REST APIs' serializer base (tasks/api/serializers.py, `WireSerializer`): one camelCase
spelling on the wire, an unknown member refused by name, JSON types taken as the schema names
them; and the validation error body (tasks/api/errors.py) that names what was refused."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from tasks.api.errors import validation_message
from tasks.api.serializers import WireSerializer, camel


class Inner(WireSerializer):
    old_url = serializers.CharField()


class Body(WireSerializer):
    rotate_key = serializers.BooleanField(default=False)
    deadline_seconds = serializers.IntegerField(required=False)
    task_ids = serializers.ListField(child=serializers.UUIDField(), required=False)
    move = Inner(required=False)


class Row:
    rotate_key = True
    deadline_seconds = 60
    task_ids: list = []
    move = None


def test_camel_spells_snake_case_names_and_leaves_camel_case_alone():
    assert camel("created_at") == "createdAt"
    assert camel("on_old_version_total") == "onOldVersionTotal"
    assert camel("contextId") == "contextId"


def test_a_snake_case_field_is_camel_case_on_the_wire_both_ways():
    assert set(Body().fields) == {"rotateKey", "deadlineSeconds", "taskIds", "move"}
    assert Body(Row()).data["rotateKey"] is True
    body = Body(data={"rotateKey": True, "move": {"oldUrl": "x"}})
    assert body.is_valid(), body.errors
    assert body.validated_data["rotate_key"] is True
    assert body.validated_data["move"] == {"old_url": "x"}


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"rotate_key": True}, "rotate_key", "the API spells it rotateKey"),
        ({"rotateKeys": True}, "rotateKeys", "this body takes: deadlineSeconds, move"),
        ({"move": {"old_url": "x"}}, "move", "the API spells it oldUrl"),
    ],
)
def test_an_unknown_member_is_refused_by_name(data, field, words):
    body = Body(data=data)
    assert not body.is_valid()
    assert field in body.errors
    assert words in validation_message(body.errors)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"rotateKey": 1}, "rotateKey"),
        ({"rotateKey": "true"}, "rotateKey"),
        ({"deadlineSeconds": "60"}, "deadlineSeconds"),
        ({"deadlineSeconds": True}, "deadlineSeconds"),
        ({"taskIds": [1]}, "taskIds"),
        ({"taskIds": "00000000-0000-0000-0000-000000000001"}, "taskIds"),
        ({"move": {"oldUrl": 5}}, "move"),
    ],
)
def test_a_member_of_another_json_type_is_refused_not_coerced(data, field):
    body = Body(data=data)
    assert not body.is_valid()
    assert field in body.errors


def test_the_message_names_each_refused_member_with_its_path():
    body = Body(data={"move": {}, "taskIds": ["x"]})
    assert not body.is_valid()
    message = validation_message(body.errors)
    assert "move.oldUrl: This field is required." in message
    assert "taskIds[0]: Must be a valid UUID." in message
