"""What the task, push-config and endpoint resources share: path and query parameters parsed
strictly (a malformed value is a 400 `invalid_request` naming the parameter, never a 404 page
from the URL resolver, never a value silently ignored), and a 405 for a method a resource
does not have (once the caller may read it) rather than a 403 for a write permission that no
write of it needs."""

from __future__ import annotations

import uuid

import django_filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema_field

from a2a_platform.api.errors import invalid
from a2a_platform.api.permissions import perm_for

# PostgreSQL's bigint: an id past it is not an id (and would fail in SQL).
_MAX_ID = 2**63 - 1

# The path parameters as the schema documents them (what the parsers below accept).
TASK_ID = OpenApiParameter("task_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
ENDPOINT_ID = OpenApiParameter(
    "endpoint_id",
    {"type": "integer", "minimum": 1, "maximum": _MAX_ID},
    OpenApiParameter.PATH,
)
CONFIG_ID = OpenApiParameter(
    "config_id",
    {"type": "string", "pattern": r"^(?!\.\.?$)[A-Za-z0-9._~-]{1,255}$"},
    OpenApiParameter.PATH,
    description="the client's config id (URL-unreserved characters, not . or ..)",
)


def uuid_param(name: str, value: str | uuid.UUID) -> uuid.UUID:
    """A UUID path parameter: anything else is the 400 every resource answers for a malformed
    id (`invalid_request` naming the parameter), never a 404 from the URL resolver."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise invalid(name, "not an id (a UUID)") from None


def task_id_param(value: str) -> uuid.UUID:
    return uuid_param("taskId", value)


def uuid_path(name: str) -> OpenApiParameter:
    return OpenApiParameter(name, OpenApiTypes.UUID, OpenApiParameter.PATH)


def int_path(name: str) -> OpenApiParameter:
    return OpenApiParameter(
        name, {"type": "integer", "minimum": 1, "maximum": _MAX_ID}, OpenApiParameter.PATH
    )


def positive_id_param(name: str, value: str) -> int:
    try:
        pk = int(value)
    except ValueError:
        pk = 0
    if not 0 < pk <= _MAX_ID or not value.isdigit():
        raise invalid(name, "not an id (a positive integer)")
    return pk


@extend_schema_field(OpenApiTypes.BOOL)
class StrictBooleanFilter(django_filters.TypedChoiceFilter):
    """`true` or `false`; anything else is a 400 (django-filter's BooleanFilter reads an
    unknown value as "not given")."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("choices", [("true", "true"), ("false", "false")])
        kwargs.setdefault("coerce", lambda value: value == "true")
        super().__init__(*args, **kwargs)


class ResourceMethods:
    """Mixed into an ApiView: a method the view does not handle needs the read permission,
    then answers 405 `method_not_allowed`."""

    def required_perm(self, request) -> str | None:
        if not hasattr(self, request.method.lower()):
            return self.read_perm
        return perm_for(self, request)
