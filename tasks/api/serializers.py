"""Request shapes of the worker API, and the serializer base of both REST APIs (`WireSerializer`,
`WireModelSerializer`): camelCase names on the wire, as the A2A wire spells them, and an
unknown request member refused by name. A2A objects inside are validated by tasks.wire."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tasks.errors import InvalidPayload
from tasks.states import TaskState


def check_storable(value: Any, field: str = "") -> None:
    """Refuse what PostgreSQL cannot store, with the path of the offending field.

    `text` and `jsonb` reject U+0000 and UTF-8 has no lone surrogates; both would otherwise
    fail at INSERT, as a 500, after the request was accepted.
    """
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidPayload(field, "must not contain NUL characters (U+0000)")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidPayload(field, "must be valid Unicode (unpaired surrogate)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            name = str(key).replace("\x00", "\\u0000")  # the path itself stays printable
            path = f"{field}.{name}" if field else name
            check_storable(key, path)
            check_storable(item, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_storable(item, f"{field}[{i}]")


def camel(name: str) -> str:
    """`created_at` -> `createdAt`; a camelCase name is left as it is."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


class WireNames:
    """Mixed into a serializer: each field declared (or generated from a model) as `snake_case`
    is on the wire as `camelCase` (its source kept), so a serializer declares model fields by
    their names and the wire has one spelling; and a request member no field reads is a 400
    naming it (a misspelt or snake_case member would otherwise be ignored, its default used)."""

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = {}
        for name, field in super().get_fields().items():
            wire = camel(name)
            if wire != name:
                if field.source is None:
                    field.source = name
                if isinstance(field, serializers.SerializerMethodField) and not field.method_name:
                    field.method_name = f"get_{name}"
            fields[wire] = field
        return fields

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            writable = {name for name, field in self.fields.items() if not field.read_only}
            unknown = sorted(str(key) for key in data if key not in writable)
            if unknown:
                raise serializers.ValidationError(
                    {name: [_unknown_member(name, writable)] for name in unknown}
                )
            mistyped = {
                name: [f"must be {expected}"]
                for name, value in data.items()
                if (expected := _json_type_error(self.fields[name], value)) is not None
            }
            if mistyped:
                raise serializers.ValidationError(mistyped)
        return super().to_internal_value(data)


# The JSON type each field takes, as the schema declares it: DRF also coerces others ("1" for
# an integer, 1 for a boolean or a UUID, 5 for a string), which the schema does not allow.
_JSON_TYPES: tuple[tuple[type, tuple[type, ...], str], ...] = (
    (serializers.BooleanField, (bool,), "a boolean"),
    (serializers.IntegerField, (int,), "an integer"),
    (serializers.FloatField, (int, float), "a number"),
    (serializers.CharField, (str,), "a string"),
    (serializers.UUIDField, (str,), "a string (a UUID)"),
    (serializers.DateTimeField, (str,), "a string (an ISO 8601 time)"),
    (serializers.ChoiceField, (str,), "a string"),
    (serializers.ListField, (list,), "an array"),
    (serializers.DictField, (dict,), "an object"),
)


def _json_type_error(field: serializers.Field, value: Any) -> str | None:
    if value is None:
        return None  # the field's own allow_null decides
    for kind, types, expected in _JSON_TYPES:
        if isinstance(field, kind):
            wrong = not isinstance(value, types) or (bool not in types and isinstance(value, bool))
            if wrong:
                return expected
            if isinstance(field, serializers.ListField):
                items = {_json_type_error(field.child, item) for item in value} - {None}
                return f"an array whose items are each {items.pop()}" if items else None
            return None
    return None


def _unknown_member(name: str, known: set[str]) -> str:
    if camel(name) in known:
        return f"unknown field: the API spells it {camel(name)}"
    return f"unknown field (this body takes: {', '.join(sorted(known)) or 'nothing'})"


class WireSerializer(WireNames, serializers.Serializer):
    pass


class WireModelSerializer(WireNames, serializers.ModelSerializer):
    pass


@extend_schema_field(
    {
        "anyOf": [{"type": "string"}, {"type": "object"}],
        "description": "a status text or an A2A Message object",
    }
)
class StatusMessageField(serializers.JSONField):
    pass


class TransitionSerializer(WireSerializer):
    state = serializers.ChoiceField(choices=[s.value for s in TaskState])
    message = StatusMessageField(required=False, allow_null=True)

    def validate_message(self, value):
        if value is not None and not isinstance(value, str | dict):
            raise serializers.ValidationError("a status text or an A2A Message object")
        return value


class ArtifactSerializer(WireSerializer):
    artifact = serializers.JSONField()
    append = serializers.BooleanField(default=False)
    lastChunk = serializers.BooleanField(default=False)  # noqa: N815 (A2A spelling)


class MessageSerializer(WireSerializer):
    message = serializers.JSONField()


class FinishSerializer(WireSerializer):
    runAgainAfter = serializers.FloatField(  # noqa: N815
        required=False, min_value=0, max_value=86400
    )
