"""OpenAPI 3 (drf-spectacular, `/api/schema/`): the Bearer scheme, the error body on every
operation's failure statuses, and the Idempotency-Key header of creating POSTs. The schema
class of every DRF view (settings DEFAULT_SCHEMA_CLASS), the worker API's included."""

from __future__ import annotations

import inspect

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiViewExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import serializers

from tasks.api import serializers as worker_serializers
from tasks.api.serializers import WireSerializer
from tasks.states import TaskState
from webhooks.models import DeliveryKind

IDEMPOTENCY_HEADER = "Idempotency-Key"

# Choice sets named once in the schema (SPECTACULAR_SETTINGS ENUM_NAME_OVERRIDES), so a
# generated client has one enum per set whatever resource carries it.
TASK_STATES = [s.value for s in TaskState]
TASK_STATES_SHORT = sorted(s.short for s in TaskState)
DELIVERY_KINDS = [k.value for k in DeliveryKind]


class ErrorDetailSerializer(WireSerializer):
    code = serializers.CharField(help_text="stable machine-readable code (docs/api.md)")
    message = serializers.CharField(help_text="what went wrong, in words")
    fields = serializers.DictField(
        required=False, help_text="validation errors by field (invalid_request)"
    )


class ErrorSerializer(WireSerializer):
    """Every failure's body; codes may add members (`field`, `rebind`, `state`, ...)."""

    error = ErrorDetailSerializer()


# Statuses every operation may answer with the error body, and those of writes.
READ_ERRORS = ("400", "401", "403", "404", "429")
WRITE_ERRORS = (*READ_ERRORS, "409", "422", "503")

# Each operation's one-line summary (by operationId): the name a generated client and the docs
# show it by. A new operation without one fails `make lint` (the schema linter).
SUMMARIES = {
    "agents_list": "List agents",
    "agents_create": "Create an agent",
    "agents_retrieve": "Read an agent",
    "agents_partial_update": "Update an agent",
    "agents_keys_list": "List an agent's A2A API keys",
    "agents_keys_create": "Create an A2A API key",
    "agents_keys_revoke_create": "Revoke an A2A API key",
    "agents_signing_keys_list": "List an agent's signing keys",
    "agents_signing_keys_rotate_create": "Rotate an agent's signing key",
    "alerts_list": "List alerts",
    "alerts_resolve_create": "Resolve an alert",
    "dashboard_retrieve": "Read the dashboard",
    "deliveries_list": "List deliveries",
    "deliveries_retrieve": "Read a delivery with its attempts",
    "deliveries_replay_create": "Replay deliveries",
    "deliveries_retry_create": "Retry deliveries now",
    "endpoints_list": "List endpoints with their health",
    "endpoints_retrieve": "Read an endpoint with its health",
    "endpoints_pause_create": "Pause an endpoint",
    "endpoints_resume_create": "Resume an endpoint",
    "rebinds_list": "List rebinds",
    "rebinds_create": "Start or preview a rebind",
    "rebinds_retrieve": "Read a rebind with its live counts",
    "rebinds_abort_create": "Abort a rebind",
    "rebinds_advance_create": "Advance a rebind",
    "rebinds_cutover_create": "Cut a rebind over",
    "rebinds_extend_create": "Extend a rebind's deadline",
    "rebinds_finish_on_old_create": "Let moves finish on the old version",
    "rebinds_move_now_create": "Move configs now",
    "rebinds_rebind_orphans_create": "Re-bind a rebind's orphaned configs",
    "tasks_list": "List tasks",
    "tasks_retrieve": "Read a task with its history",
    "tasks_push_configs_list": "List a task's push configs",
    "tasks_push_configs_retrieve": "Read a task's push config",
    "tokens_list": "List API tokens",
    "tokens_create": "Create an API token",
    "tokens_retrieve": "Read an API token",
    "tokens_revoke_create": "Revoke an API token",
    "worker_claim_create": "Claim the next dispatch (worker)",
    "worker_dispatches_finish_create": "Finish a dispatch (worker)",
    "worker_dispatches_renew_create": "Renew a dispatch's lease (worker)",
    "worker_tasks_retrieve": "List the agent's tasks in a state (worker)",
    "worker_tasks_artifacts_create": "Add an artifact to a task (worker)",
    "worker_tasks_messages_create": "Add a message to a task (worker)",
    "worker_tasks_transition_create": "Move a task to a state (worker)",
}


class ApiAutoSchema(AutoSchema):
    # extend_schema(summary=..., description=...) overrides both methods where it is given.
    def get_summary(self):
        return SUMMARIES.get(self.get_operation_id())

    def get_description(self):
        # The method's or the view's own docstring, never one inherited from a base class:
        # those describe the base to its subclasses' authors, not the operation to a client.
        action = getattr(self.view, self.method.lower(), None)
        own = getattr(action, "__doc__", None) or type(self.view).__dict__.get("__doc__")
        return inspect.cleandoc(own) if own else ""

    def _is_list_view(self, serializer=None) -> bool:
        if self.method == "GET" and getattr(self.view, "is_list", False):
            return True
        return super()._is_list_view(serializer)

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        statuses = READ_ERRORS if self.method in ("GET", "HEAD") else WRITE_ERRORS
        if self.method in ("POST", "PUT", "PATCH") and self.get_request_serializer() is not None:
            statuses = (*statuses, "415")  # a body that is not JSON
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
                    {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 255,
                        # printable ASCII (idempotency.claim); anything else is a 400
                        "pattern": "^[\\x20-\\x7e]+$",
                    },
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
    responses: dict[int, object] = {200: OpenApiTypes.OBJECT}
    if name == "ClaimView":
        responses[204] = OpenApiResponse(description="nothing to claim now: ask again later")

    def view_replacement(self):
        described = extend_schema(request=request, responses=responses, tags=["worker"])
        return extend_schema_view(**{method: described})(
            type(
                name,
                (self.target_class,),
                {"__module__": self.target_class.__module__, "__doc__": self.target_class.__doc__},
            )
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


def postprocess(result: dict, generator, request, public) -> dict:
    """SPECTACULAR_SETTINGS POSTPROCESSING_HOOKS: the schema is OpenAPI 3.1, where null is a
    type; DRF's pagination still says OpenAPI 3.0's `nullable`, rewritten here as a type list
    (which generators read, and linters require)."""

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.pop("nullable", False) and isinstance(node.get("type"), str):
                node["type"] = [node["type"], "null"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(result.get("components", {}))
    for name, component in result.get("components", {}).get("schemas", {}).items():
        # A request body's members are the ones listed: another is refused by name
        # (tasks/api/serializers.py WireNames), and the schema says so.
        if name.endswith("Request") and component.get("type") == "object":
            component.setdefault("additionalProperties", False)
    _rate_limit_headers(result)
    _query_rules(result)
    _links(result)
    return result


def _query_rules(result: dict) -> None:
    """The rules every query parameter follows (views.ApiView.initial): not empty (leave a
    filter out for no filter) and no NUL character (U+0000); either is a 400."""
    for item in result.get("paths", {}).values():
        for operation in item.values():
            for param in operation.get("parameters", []):
                schema = param.get("schema", {})
                if param.get("in") != "query" or schema.get("type") != "string":
                    continue
                if "enum" not in schema:
                    schema.setdefault("minLength", 1)
                    schema.setdefault("pattern", "^[^\\u0000]*$")


# OpenAPI links (section 4.7.20): what an answer hands to the next call, so a client (and the
# stateful fuzzing of tests/integration/api/test_schema_fuzz.py) can follow them.
# operationId -> status -> link name -> (target operationId, {parameter: expression}).
LINKS: dict[str, dict[str, dict[str, tuple[str, dict[str, str]]]]] = {
    "agents_create": {
        "201": {
            "ReadAgent": ("agents_retrieve", {"slug": "$response.body#/slug"}),
            "UpdateAgent": ("agents_partial_update", {"slug": "$response.body#/slug"}),
            "ListKeys": ("agents_keys_list", {"slug": "$response.body#/slug"}),
            "CreateKey": ("agents_keys_create", {"slug": "$response.body#/slug"}),
            "ListSigningKeys": ("agents_signing_keys_list", {"slug": "$response.body#/slug"}),
        }
    },
    "agents_keys_create": {
        "201": {
            "RevokeKey": (
                "agents_keys_revoke_create",
                {"slug": "$response.body#/agent", "key_id": "$response.body#/id"},
            )
        }
    },
    "rebinds_create": {
        "201": {
            "ReadRebind": ("rebinds_retrieve", {"id": "$response.body#/id"}),
            "AbortRebind": ("rebinds_abort_create", {"id": "$response.body#/id"}),
            "ExtendRebind": ("rebinds_extend_create", {"id": "$response.body#/id"}),
            "AdvanceRebind": ("rebinds_advance_create", {"id": "$response.body#/id"}),
        }
    },
    "agents_signing_keys_rotate_create": {
        "201": {
            "ReadRebind": ("rebinds_retrieve", {"id": "$response.body#/id"}),
            "AbortRebind": ("rebinds_abort_create", {"id": "$response.body#/id"}),
        }
    },
    "tokens_create": {
        "201": {
            "ReadToken": ("tokens_retrieve", {"id": "$response.body#/id"}),
            "RevokeToken": ("tokens_revoke_create", {"id": "$response.body#/id"}),
        }
    },
}


def _links(result: dict) -> None:
    operations = {
        operation["operationId"]: operation
        for item in result.get("paths", {}).values()
        for operation in item.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    for source, by_status in LINKS.items():
        for status, links in by_status.items():
            response = operations[source]["responses"][status]
            response["links"] = {
                name: {"operationId": target, "parameters": parameters}
                for name, (target, parameters) in links.items()
            }


_RATE_HEADERS = {
    "RateLimit-Limit": "requests allowed in the window (A2A_API_RATE)",
    "RateLimit-Remaining": "requests left in the window",
    "RateLimit-Reset": "seconds until the window frees a request",
}
_RETRY_AFTER = "seconds to wait before retrying"


def _rate_limit_headers(result: dict) -> None:
    """The management API's throttle headers on each answer it documents, Retry-After on its
    429 (and on the 409 and 503 that carry one); the worker API is not throttled."""
    components = result.setdefault("components", {}).setdefault("headers", {})
    for name, description in {**_RATE_HEADERS, "Retry-After": _RETRY_AFTER}.items():
        components[name] = {
            "description": description,
            "schema": {"type": "integer", "minimum": 0},
        }
    for path, item in result.get("paths", {}).items():
        if path.startswith("/api/v1/worker/"):
            continue
        for operation in item.values():
            for status, response in operation.get("responses", {}).items():
                headers = response.setdefault("headers", {})
                for name in _RATE_HEADERS:
                    headers[name] = {"$ref": f"#/components/headers/{name}"}
                if status in ("409", "429", "503"):
                    headers["Retry-After"] = {"$ref": "#/components/headers/Retry-After"}


def lib_doc_excludes() -> list[type]:
    """SPECTACULAR_SETTINGS GET_LIB_DOC_EXCLUDES: the serializer base's docstring describes the
    base, not a component, so a serializer without its own has no description."""
    from drf_spectacular.plumbing import get_lib_doc_excludes

    from tasks.api.serializers import WireNames

    return [*get_lib_doc_excludes(), WireNames]
