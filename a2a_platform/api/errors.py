"""The one exception handler of every REST API (settings REST_FRAMEWORK EXCEPTION_HANDLER):
each failure is `{"error": {"code", "message", ...}}` with the status docs/api.md lists.

Domain errors of the services are mapped here, in one table; the worker API's own codes
(tasks/api/errors.py) and DRF's (validation, authentication, permission, throttling, ...)
go through the worker API's handler, whose shapes this API shares."""

from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.db import DataError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response

from a2a_platform.api.services import TokenRefused
from agents.services import AgentError
from tasks.api.errors import exception_handler as worker_exception_handler
from tasks.api.errors import validation_message
from tasks.api.serializers import camel
from webhooks.errors import (
    PushDeliveryUnavailable,
    PushNotSupported,
    RebindConflict,
    RebindInvalid,
    RebindNotFound,
)
from webhooks.rebinds.machine import IllegalRebindTransition


def error_body(code: str, message: str, **extra: object) -> dict:
    """The error body every API failure has."""
    return {"error": {"code": code, "message": message, **extra}}


class ApiError(exceptions.APIException):
    """A refusal with its code, status and extra members; raise it (or a subclass) from a
    view and the handler renders it."""

    status_code = status.HTTP_400_BAD_REQUEST
    code = "invalid_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status_code: int | None = None,
        headers: dict[str, str] | None = None,
        **extra: object,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status_code is not None:
            self.status_code = status_code
        self.headers = headers or {}
        self.extra = extra


def invalid(field: str, message: str) -> ApiError:
    """A 400 `invalid_request` naming the field (the validation shape: `fields`)."""
    return ApiError(f"{field}: {message}", field=field, fields={field: [message]})


def not_found(message: str = "not found") -> ApiError:
    return ApiError(message, code="not_found", status_code=status.HTTP_404_NOT_FOUND)


class IdempotencyKeyReused(ApiError):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    code = "idempotency_key_reused"


class IdempotencyInProgress(ApiError):
    status_code = status.HTTP_409_CONFLICT
    code = "idempotency_in_progress"


# The services name what they refuse as the models do; the request members that carry them
# (camelCase, as every other field of the API) where the name is not simply the camelCase one.
_WIRE_FIELDS = {
    "move_prefix": "movePrefix",
    "move_from": "movePrefix.old",
    "move_to": "movePrefix.new",
    "move_origin": "movePrefix.origin",
    "new_url": "config.url",
    "new_token": "config.token",
    "new_auth_scheme": "config.authScheme",
    "new_credentials": "config.credentials",
    "deadline": "deadlineSeconds",
    # "name at least one of ...": the body as a whole
    "scope": "body",
}


def wire_field(name: str) -> str:
    return _WIRE_FIELDS.get(name) or camel(name)


def _mapped(exc: Exception) -> ApiError | None:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RebindInvalid | TokenRefused):
        message = exc.description if isinstance(exc, RebindInvalid) else str(exc)
        field = exc.field if isinstance(exc, TokenRefused) else wire_field(exc.field)
        return invalid(field, message)
    if isinstance(exc, AgentError):
        if not exc.fields:
            return ApiError(str(exc))
        fields = {wire_field(name): problems for name, problems in exc.fields.items()}
        return ApiError(validation_message(fields), fields=fields)
    if isinstance(exc, RebindNotFound | Http404 | ObjectDoesNotExist):
        return not_found(str(exc) or "not found")
    if isinstance(exc, RebindConflict):
        return ApiError(str(exc), code="rebind_conflict", status_code=409, rebind=str(exc.other_pk))
    if isinstance(exc, IllegalRebindTransition):
        return ApiError(str(exc), code="illegal_transition", status_code=409, state=exc.state)
    if isinstance(exc, DataError):
        # A value the database cannot hold (out of range, an offset PostgreSQL refuses): the
        # input's fault, and nothing was written (the statement failed). The views check
        # inputs first; this is the net under what a check missed.
        return ApiError("a value in the request is out of the range the store accepts")
    if isinstance(exc, PushNotSupported):
        return ApiError(str(exc), code="push_not_supported", status_code=409)
    if isinstance(exc, PushDeliveryUnavailable):
        return ApiError(
            str(exc),
            code="push_unavailable",
            status_code=503,
            headers={"Retry-After": str(exc.retry_after)},
            retryAfter=exc.retry_after,
        )
    return None


def exception_handler(exc: Exception, context: dict) -> Response | None:
    mapped = _mapped(exc)
    if mapped is not None:
        return Response(
            error_body(mapped.code, mapped.message, **mapped.extra),
            status=mapped.status_code,
            headers=mapped.headers,
        )
    response = worker_exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.Throttled) and exc.wait is not None:
        response.data["error"]["retryAfter"] = int(exc.wait + 0.999)
    return response
