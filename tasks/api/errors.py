"""One place that maps domain errors to REST API errors: `{"error": {"code", "message", ...}}`."""

from __future__ import annotations

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from tasks.errors import (
    DispatchLeaseLost,
    InvalidPayload,
    NotExternalExecutor,
    TaskNotFound,
    TaskTerminal,
)
from tasks.state_machine import IllegalTransition


def _body(code: str, message: str, **extra: object) -> dict:
    return {"error": {"code": code, "message": message, **extra}}


def _at(path: str, key: object) -> str:
    """A member's path: `movePrefix.old`; an item's (DRF keys a list's errors by index, as
    integers or, once rendered, as digit strings): `moves[2]`."""
    if path and (isinstance(key, int) or str(key).isdigit()):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _flat(errors: object, path: str = "") -> list[tuple[str, str]]:
    """Validation errors as (field path, message) pairs: `movePrefix.old`, `moves[2]`."""
    if isinstance(errors, dict):
        return [pair for key, value in errors.items() for pair in _flat(value, _at(path, key))]
    if isinstance(errors, list):
        if all(not isinstance(e, dict | list) for e in errors):
            return [(path or "body", str(e)) for e in errors]
        return [pair for i, e in enumerate(errors) for pair in _flat(e, f"{path}[{i}]")]
    return [(path or "body", str(errors))]


def _printable(errors: object) -> object:
    """Validation errors with NUL (U+0000) written `\\u0000`: DRF's messages quote what was
    sent (an unknown member's name, a refused choice), and a NUL neither belongs in an answer
    nor can be kept by PostgreSQL (the Idempotency-Key store keeps the answer)."""
    if isinstance(errors, dict):
        return {_printable(str(key)): _printable(value) for key, value in errors.items()}
    if isinstance(errors, list):
        return [_printable(e) for e in errors]
    return str(errors).replace("\x00", "\\u0000")


def validation_message(errors: object) -> str:
    """One line naming each field refused and why (the `fields` member has them by field)."""
    return "; ".join(f"{field}: {message}" for field, message in _flat(errors))


def exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, TaskNotFound):
        return Response(_body("task_not_found", str(exc)), status=status.HTTP_404_NOT_FOUND)
    if isinstance(exc, TaskTerminal):
        return Response(
            _body("task_terminal", str(exc), state=exc.state), status=status.HTTP_409_CONFLICT
        )
    if isinstance(exc, IllegalTransition):
        return Response(
            _body(
                "illegal_transition",
                str(exc),
                fromState=exc.from_state.value,
                toState=exc.to_state.value,
            ),
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, NotExternalExecutor):
        return Response(_body("not_external", str(exc)), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DispatchLeaseLost):
        return Response(_body("lease_lost", str(exc)), status=status.HTTP_409_CONFLICT)
    if isinstance(exc, InvalidPayload):
        return Response(
            _body("invalid_payload", exc.description, field=exc.field),
            status=status.HTTP_400_BAD_REQUEST,
        )
    response = drf_exception_handler(exc, context)
    if response is not None:
        code = getattr(exc, "default_code", "error")
        if isinstance(exc, exceptions.ValidationError):
            fields = _printable(
                response.data if isinstance(response.data, dict) else {"body": response.data}
            )
            named = {field for field, _ in _flat(fields)}
            one = {"field": named.pop()} if len(named) == 1 else {}
            response.data = _body(
                "invalid_request", validation_message(fields), **one, fields=fields
            )
        else:
            detail = (
                response.data.get("detail", str(exc)) if isinstance(response.data, dict) else exc
            )
            response.data = _body(str(code), str(detail))
    return response
