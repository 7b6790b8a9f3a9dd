"""The HTTP+JSON binding: one route per operation (routes.py), answered
`application/a2a+json` (`application/json` on the v0.3 URLs, through v03.py).

The operation's params are the query string (typed: integers, booleans), the JSON body of a
POST, PUT or PATCH, and the ids in the path, in that order of precedence; errors are rendered
with their HTTP status (binding.rest_error). A streaming route answers with SSE
(binding.open_stream).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from a2a_platform.lib.json_bytes import dumps
from a2a_platform.protocol import v03
from a2a_platform.protocol.binding import (
    REST_MEDIA,
    as_protocol_error,
    extensions_header,
    open_stream,
    request_ctx,
    requested_version,
    rest_error,
)
from a2a_platform.protocol.body import parse_json, read_body
from a2a_platform.protocol.context import V03, V1
from a2a_platform.protocol.errors import (
    METHOD_NOT_FOUND,
    VERSION_NOT_SUPPORTED,
    ProtocolError,
    invalid_params,
)
from a2a_platform.protocol.routes import METHODS, STREAMING_OPERATIONS, Route

_INT_QUERY = {"pageSize", "historyLength"}
_BOOL_QUERY = {"includeArtifacts"}


def _query_params(request: Request) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if not request.scope["query_string"]:  # most requests: no parse, no QueryParams
        return params
    for key, value in request.query_params.multi_items():
        if key == "A2A-Version":
            continue
        if "\x00" in key or "\x00" in value:  # as in bodies: PostgreSQL text refuses NUL
            raise invalid_params(key.replace("\x00", "\\u0000"), "must not contain NUL (U+0000)")
        if key in _INT_QUERY:
            try:
                params[key] = int(value)
            except ValueError:
                raise invalid_params(key, "must be an integer") from None
        elif key in _BOOL_QUERY:
            if value not in ("true", "false"):
                raise invalid_params(key, "must be true or false")
            params[key] = value == "true"
        else:
            params[key] = value
    return params


def _path_params(route: Route) -> dict[str, str]:
    out = {}
    if "id" in route.params:
        key = "taskId" if "PushNotificationConfig" in route.name else "id"
        out[key] = route.params["id"]
    if "config_id" in route.params:
        out["id"] = route.params["config_id"]
    if route.tenant:
        out["tenant"] = route.tenant
    return out


async def handle(request: Request, route: Route) -> Response:
    """A request to an operation's route."""
    try:
        header_version = requested_version(request)
        version = V03 if route.legacy else (header_version or V1)
        if version == V03 and not route.legacy:
            raise ProtocolError(METHOD_NOT_FOUND, "v0.3 clients use the agent's v0.3 interface URL")
        params = _query_params(request)
        if request.method in ("POST", "PUT", "PATCH"):
            body = await read_body(request)
            if body.strip():
                data = parse_json(body)
                if not isinstance(data, dict):
                    raise invalid_params("body", "must be a JSON object")
                params.update(data)
        params.update(_path_params(route))
        ctx = await request_ctx(request, route.tenant, version)
        if header_version is None and not route.legacy and ctx.agent.strict_version_header:
            # The agent's strict switch: no A2A-Version header means 0.3 (§3.6.2), which
            # this URL does not serve.
            raise ProtocolError(
                VERSION_NOT_SUPPORTED,
                "no A2A-Version header means 0.3, which this URL does not serve: send "
                "A2A-Version: 1.0, or use the agent's v0.3 interface URL",
                metadata={"supported": "1.0"},
            )
        if route.name in STREAMING_OPERATIONS:
            last_event_id = request.headers.get("last-event-id")
            return await open_stream(ctx, route.name, params, last_event_id, rest=True)
        if version == V03:
            result = await v03.call(ctx, route.name, params, rest=True)
        else:
            result = await METHODS[route.name](ctx, params)
    except Exception as exc:
        return rest_error(as_protocol_error(exc), legacy=route.legacy)
    media = "application/json" if route.legacy else REST_MEDIA
    return Response(dumps(result), media_type=media, headers=extensions_header(ctx))
