"""Request shapes of the worker API. A2A objects inside are validated by tasks.wire."""

from __future__ import annotations

from rest_framework import serializers

from tasks.states import TaskState


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
