"""The A2A error taxonomy in one table, and its two renderings (JSON-RPC and HTTP+JSON).

Codes and HTTP statuses follow the spec's v1.0.1 mapping (digest §8); every error carries a
`google.rpc.ErrorInfo` with a `reason` clients can key on. Domain errors raised by services
are mapped here and nowhere else (`from_domain`; `orm` and `domain_errors` await a call with
them mapped).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from a2a_platform.lib.orm import run_orm
from a2a_platform.lib.reconnect import database_unreachable

T = TypeVar("T")

DOMAIN = "a2a-protocol.org"
PLATFORM_DOMAIN = "a2a-platform"
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"
RETRY_INFO_TYPE = "type.googleapis.com/google.rpc.RetryInfo"


@dataclass(frozen=True)
class Kind:
    reason: str
    jsonrpc_code: int
    http_status: int
    grpc_status: str
    default_message: str
    domain: str = DOMAIN


TASK_NOT_FOUND = Kind("TASK_NOT_FOUND", -32001, 404, "NOT_FOUND", "Task not found")
TASK_NOT_CANCELABLE = Kind(
    "TASK_NOT_CANCELABLE", -32002, 400, "FAILED_PRECONDITION", "Task cannot be canceled"
)
PUSH_NOT_SUPPORTED = Kind(
    "PUSH_NOTIFICATION_NOT_SUPPORTED",
    -32003,
    400,
    "FAILED_PRECONDITION",
    "Push notifications are not supported",
)
UNSUPPORTED_OPERATION = Kind(
    "UNSUPPORTED_OPERATION", -32004, 400, "FAILED_PRECONDITION", "This operation is not supported"
)
CONTENT_TYPE_NOT_SUPPORTED = Kind(
    "CONTENT_TYPE_NOT_SUPPORTED", -32005, 400, "INVALID_ARGUMENT", "Incompatible content types"
)
INVALID_AGENT_RESPONSE = Kind(
    "INVALID_AGENT_RESPONSE", -32006, 500, "INTERNAL", "Invalid agent response"
)
EXTENSION_SUPPORT_REQUIRED = Kind(
    "EXTENSION_SUPPORT_REQUIRED",
    -32008,
    400,
    "FAILED_PRECONDITION",
    "A required extension was not activated",
)
VERSION_NOT_SUPPORTED = Kind(
    "VERSION_NOT_SUPPORTED", -32009, 400, "FAILED_PRECONDITION", "Protocol version not supported"
)
PARSE_ERROR = Kind("PARSE_ERROR", -32700, 400, "INVALID_ARGUMENT", "Invalid JSON payload")
INVALID_REQUEST = Kind("INVALID_REQUEST", -32600, 400, "INVALID_ARGUMENT", "Invalid request")
METHOD_NOT_FOUND = Kind("METHOD_NOT_FOUND", -32601, 404, "NOT_FOUND", "Method not found")
INVALID_PARAMS = Kind("INVALID_PARAMS", -32602, 400, "INVALID_ARGUMENT", "Invalid parameters")
INTERNAL = Kind("INTERNAL", -32603, 500, "INTERNAL", "Internal error")
# An HTTP method the route does not take (HTTP+JSON, or a GET on a JSON-RPC URL): 405 with
# Allow; gRPC's UNIMPLEMENTED ("not supported by this server") is the nearest status.
METHOD_NOT_ALLOWED = Kind(
    "METHOD_NOT_ALLOWED", -32601, 405, "UNIMPLEMENTED", "Method not allowed", PLATFORM_DOMAIN
)
# Outside the spec's table (docs/decisions.md): implementation-defined server errors.
UNAUTHENTICATED = Kind(
    "UNAUTHENTICATED", -32000, 401, "UNAUTHENTICATED", "Authentication required", PLATFORM_DOMAIN
)
PAYLOAD_TOO_LARGE = Kind(
    "PAYLOAD_TOO_LARGE", -32600, 413, "INVALID_ARGUMENT", "Request body too large", PLATFORM_DOMAIN
)
UNAVAILABLE = Kind(
    "UNAVAILABLE", -32603, 503, "UNAVAILABLE", "Temporarily unavailable", PLATFORM_DOMAIN
)


@dataclass
class ProtocolError(Exception):
    kind: Kind
    message: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    violations: list[tuple[str, str]] = field(default_factory=list)
    retry_after: int | None = None
    reason: str | None = None  # overrides kind.reason (e.g. PUSH_DELIVERY_UNAVAILABLE)

    def __post_init__(self) -> None:
        self.message = self.message or self.kind.default_message
        super().__init__(self.message)

    def details(self) -> list[dict[str, Any]]:
        info: dict[str, Any] = {
            "@type": ERROR_INFO_TYPE,
            "reason": self.reason or self.kind.reason,
            "domain": self.kind.domain,
        }
        if self.metadata:
            info["metadata"] = {k: str(v) for k, v in self.metadata.items()}
        out = [info]
        if self.violations:
            out.append(
                {
                    "@type": BAD_REQUEST_TYPE,
                    "fieldViolations": [{"field": f, "description": d} for f, d in self.violations],
                }
            )
        if self.retry_after is not None:
            out.append({"@type": RETRY_INFO_TYPE, "retryDelay": f"{self.retry_after}s"})
        return out

    def jsonrpc_error(self) -> dict[str, Any]:
        return {"code": self.kind.jsonrpc_code, "message": self.message, "data": self.details()}

    def rest_body(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.kind.http_status,
                "status": self.kind.grpc_status,
                "message": self.message,
                "details": self.details(),
            }
        }

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.kind is UNAUTHENTICATED:
            headers["WWW-Authenticate"] = 'Bearer realm="a2a"'
        return headers


def invalid_params(field_path: str, description: str) -> ProtocolError:
    return ProtocolError(
        INVALID_PARAMS, f"{field_path}: {description}", violations=[(field_path, description)]
    )


# How long a client is told to wait when the database is unreachable: a restart or fail-over
# takes seconds; the readiness gate's refusals say 5 s, a database blip is usually shorter.
DATABASE_RETRY_AFTER_SECONDS = 2


def database_unavailable() -> ProtocolError:
    return ProtocolError(
        UNAVAILABLE,
        "the task store is temporarily unreachable; nothing was lost, retry shortly",
        reason="DATABASE_UNAVAILABLE",
        retry_after=DATABASE_RETRY_AFTER_SECONDS,
    )


def from_domain(exc: Exception) -> ProtocolError | None:
    """Map a domain error raised by a service; None if it is not one (a bug: 500). A database
    outage is mapped too: a retryable refusal (DATABASE_UNAVAILABLE, 503 + Retry-After)."""
    from tasks.errors import InvalidPayload, TaskNotFound, TaskTerminal
    from tasks.state_machine import IllegalTransition
    from webhooks.errors import PushDeliveryUnavailable, PushNotSupported

    if isinstance(exc, ProtocolError):
        return exc
    if database_unreachable(exc):
        return database_unavailable()
    if isinstance(exc, TaskNotFound):
        return ProtocolError(TASK_NOT_FOUND, metadata={"taskId": exc.task_id})
    if isinstance(exc, TaskTerminal):
        return ProtocolError(
            UNSUPPORTED_OPERATION,
            f"task is in terminal state {exc.state}; start a new task in the same context",
            metadata={"taskId": exc.task_id, "state": exc.state},
        )
    if isinstance(exc, IllegalTransition):
        if exc.to_state.value == "TASK_STATE_CANCELED":
            return ProtocolError(
                TASK_NOT_CANCELABLE,
                f"task is {exc.from_state.short} and cannot be canceled",
                metadata={"state": exc.from_state.value},
            )
        return ProtocolError(UNSUPPORTED_OPERATION, str(exc))
    if isinstance(exc, InvalidPayload):
        return invalid_params(exc.field, exc.description)
    if isinstance(exc, PushNotSupported):
        return ProtocolError(PUSH_NOT_SUPPORTED, str(exc))
    if isinstance(exc, PushDeliveryUnavailable):
        return ProtocolError(
            UNAVAILABLE, str(exc), reason="PUSH_DELIVERY_UNAVAILABLE", retry_after=exc.retry_after
        )
    return None


async def orm(fn):
    """Run a short ORM call; map domain errors to protocol errors."""
    return await domain_errors(run_orm(fn))


async def domain_errors(awaitable: Awaitable[T]) -> T:
    """Await it; map domain errors to protocol errors."""
    try:
        return await awaitable
    except Exception as exc:
        mapped = from_domain(exc)
        if mapped is None:
            raise
        raise mapped from None
