"""OpenAPI 3 (drf-spectacular, `/api/schema/`): the Bearer scheme, the error body on every
operation's failure statuses, and the Idempotency-Key header of creating POSTs. The schema
class of every DRF view (settings DEFAULT_SCHEMA_CLASS), the worker API's included."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiViewExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers

from tasks.api import serializers as worker_serializers

IDEMPOTENCY_HEADER = "Idempotency-Key"


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="stable machine-readable code (docs/api.md)")
    message = serializers.CharField(help_text="what went wrong, in words")
    fields = serializers.DictField(
        required=False, help_text="validation errors by field (invalid_request)"
    )


class ErrorSerializer(serializers.Serializer):
    """Every failure's body; codes may add members (`field`, `rebind`, `state`, ...)."""

    error = ErrorDetailSerializer()


# Statuses every operation may answer with the error body, and those of writes.
READ_ERRORS = ("400", "401", "403", "404", "429")
WRITE_ERRORS = (*READ_ERRORS, "409", "422", "503")


class ApiAutoSchema(AutoSchema):
    def _is_list_view(self, serializer=None) -> bool:
        if self.method == "GET" and getattr(self.view, "is_list", False):
            return True
        return super()._is_list_view(serializer)

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        statuses = READ_ERRORS if self.method in ("GET", "HEAD") else WRITE_ERRORS
        for status in statuses:
            if status not in responses:
                responses[status] = self._get_response_for_code(
                    ErrorSerializer, status, direction=direction
                )
        return responses

    def get_override_parameters(self):
        params = list(super().get_override_parameters())
        if self.method == "POST" and getattr(self.view, "idempotent", False):
            params.append(
                OpenApiParameter(
                    IDEMPOTENCY_HEADER,
                    str,
                    OpenApiParameter.HEADER,
                    required=False,
                    description=(
                        "A retry with the same key and body returns the first response and "
                        "creates nothing (kept 24 h, per token or user); the same key with "
                        "another body is 422 idempotency_key_reused."
                    ),
                )
            )
        return params


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "a2a_platform.api.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An integrator's token `a2apt_...` (manage.py create_api_token)",
        }


class WorkerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "tasks.api.auth.WorkerTokenAuthentication"
    name = "workerToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An agent's worker API key `a2a_...` (docs/worker-api.md)",
        }


# --- the worker API (tasks/api/): plain APIViews, described here so /api/schema/ covers every
# route under /api/v1/ without touching the views; bodies are documented in docs/worker-api.md.


def _describe_worker_view(name: str, method: str, request: object) -> None:
    def view_replacement(self):
        described = extend_schema(
            request=request, responses={200: OpenApiTypes.OBJECT}, tags=["worker"]
        )
        return extend_schema_view(**{method: described})(
            type(name, (self.target_class,), {"__module__": self.target_class.__module__})
        )

    type(
        f"{name}Schema",
        (OpenApiViewExtension,),
        {"target_class": f"tasks.api.views.{name}", "view_replacement": view_replacement},
    )


for _name, _method, _request in [
    ("TaskListView", "get", None),
    ("ClaimView", "post", OpenApiTypes.OBJECT),
    ("DispatchRenewView", "post", None),
    ("DispatchFinishView", "post", worker_serializers.FinishSerializer),
    ("TransitionView", "post", worker_serializers.TransitionSerializer),
    ("ArtifactView", "post", worker_serializers.ArtifactSerializer),
    ("MessageView", "post", worker_serializers.MessageSerializer),
]:
    _describe_worker_view(_name, _method, _request)
