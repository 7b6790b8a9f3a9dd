"""Request shapes of the worker API. A2A objects inside are validated by tasks.wire."""

from __future__ import annotations

from typing import Any

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


class TransitionSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=[s.value for s in TaskState])
    message = serializers.JSONField(required=False, allow_null=True)

    def validate_message(self, value):
        if value is not None and not isinstance(value, str | dict):
            raise serializers.ValidationError("a status text or an A2A Message object")
        return value


class ArtifactSerializer(serializers.Serializer):
    artifact = serializers.JSONField()
    append = serializers.BooleanField(default=False)
    lastChunk = serializers.BooleanField(default=False)  # noqa: N815 (A2A spelling)


class MessageSerializer(serializers.Serializer):
    message = serializers.JSONField()


class FinishSerializer(serializers.Serializer):
    runAgainAfter = serializers.FloatField(  # noqa: N815
        required=False, min_value=0, max_value=86400
    )
