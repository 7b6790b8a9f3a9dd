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
            response.data = _body("invalid_request", "invalid request", fields=response.data)
        else:
            detail = (
                response.data.get("detail", str(exc)) if isinstance(response.data, dict) else exc
            )
            response.data = _body(str(code), str(detail))
    return response
