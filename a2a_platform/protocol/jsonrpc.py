"""The JSON-RPC 2.0 binding: one request or a batch POSTed to the agent's URL, answered
`application/json`.

Parse the envelope (JSON-RPC 2.0 §4-§6: ids, notifications, batches), pick the method's A2A
version (a v0.3 method name, or the v0.3 URL, speaks v0.3 through v03.py), call the one
operation, render the result or the error. Errors travel with HTTP 200 except the
transport-level refusals a proxy must see (401, 413, and 503 for a stream refused for
capacity). A streaming method answers with SSE (binding.open_stream).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from starlette.requests import Request
from starlette.responses import Response

from a2a_platform.lib import tracing
from a2a_platform.lib.json_bytes import dumps
from a2a_platform.protocol import sse, v03
from a2a_platform.protocol.binding import (
    JSONRPC_MEDIA,
    as_protocol_error,
    open_stream,
    request_ctx,
    requested_version,
    rpc_response,
)
from a2a_platform.protocol.body import parse_json, read_body
from a2a_platform.protocol.context import V03, V1, Ctx
from a2a_platform.protocol.errors import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    ProtocolError,
    invalid_params,
)
from a2a_platform.protocol.routes import METHODS, STREAMING_OPERATIONS, Route


def _http_status(error: ProtocolError) -> int:
    # JSON-RPC errors travel with HTTP 200 (temporary refusals carry a RetryInfo detail and a
    # Retry-After header), except the transport-level refusals a proxy or client library must
    # see: too large, unauthenticated.
    return error.kind.http_status if error.kind.http_status in (401, 413) else 200


async def handle(request: Request, route: Route) -> Response:
    """A POST to a JSON-RPC URL: one request, a notification or a batch."""
    try:
        header_version = requested_version(request)
        if route.legacy and header_version != V1:
            # The v0.3 URL speaks 0.3 unless the client asks for 1.0 (§3.6.2: a server
            # processes a request with the semantics of the version it names).
            header_version = V03
        payload = parse_json(await read_body(request))
    except ProtocolError as exc:
        return Response(
            dumps(rpc_response(None, error=exc)),
            status_code=_http_status(exc),
            media_type=JSONRPC_MEDIA,
            headers=exc.headers(),
        )
    ctx_cache: dict[tuple[str, str | None], Ctx] = {}

    async def ctx_for(version: str, tenant: str | None) -> Ctx:
        # At the origin root, `params.tenant` names the agent; under /{slug} the path wins.
        tenant = route.tenant or tenant
        if (version, tenant) not in ctx_cache:
            ctx_cache[version, tenant] = await request_ctx(request, tenant, version)
        return ctx_cache[version, tenant]

    if isinstance(payload, list):
        if not payload:
            err = ProtocolError(INVALID_REQUEST, "empty batch")
            return Response(dumps(rpc_response(None, error=err)), media_type=JSONRPC_MEDIA)
        if len(payload) > settings.A2A_JSONRPC_MAX_BATCH:
            err = ProtocolError(
                INVALID_REQUEST,
                f"batch of {len(payload)} exceeds the limit of {settings.A2A_JSONRPC_MAX_BATCH}",
            )
            return Response(dumps(rpc_response(None, error=err)), media_type=JSONRPC_MEDIA)
        answers = []
        for item in payload:
            answer, _ = await _rpc_one(item, header_version, ctx_for, in_batch=True)
            if answer is not None:
                answers.append(answer)
        if not answers:
            return Response(status_code=204)
        return Response(dumps(answers), media_type=JSONRPC_MEDIA)

    answer, status = await _rpc_one(
        payload,
        header_version,
        ctx_for,
        in_batch=False,
        last_event_id=request.headers.get("last-event-id"),
    )
    if isinstance(answer, sse.SSEResponse):
        return answer
    if answer is None:
        return Response(status_code=204)
    headers = {}
    if ctx_cache:
        activated = next(iter(ctx_cache.values())).activated_extensions
        if activated:
            headers["A2A-Extensions"] = ",".join(sorted(activated))
    if "error" in answer:
        headers.update(answer.pop("_headers", {}))  # WWW-Authenticate, Retry-After
    answer.pop("_headers", None)
    return Response(dumps(answer), status_code=status, media_type=JSONRPC_MEDIA, headers=headers)


async def _rpc_one(
    item: Any,
    header_version: str | None,
    ctx_for,
    *,
    in_batch: bool,
    last_event_id: str | None = None,
):
    """(response dict, an SSEResponse for a stream, or None for a notification; HTTP
    status)."""
    if not isinstance(item, dict):
        return rpc_response(None, error=ProtocolError(INVALID_REQUEST, "not an object")), 200
    id_ = item.get("id")
    is_notification = "id" not in item
    if not (
        id_ is None or isinstance(id_, str) or (isinstance(id_, int) and not isinstance(id_, bool))
    ):
        err = ProtocolError(INVALID_REQUEST, "id must be a string, a number or null")
        return rpc_response(None, error=err), 200
    version = header_version or V1
    # JSON-RPC 2.0 §4.1 and §5: only a valid Request without an id is a notification; one
    # that is not a valid Request is answered with an error whose id is null.
    if item.get("jsonrpc") != "2.0":
        err = ProtocolError(INVALID_REQUEST, 'jsonrpc must be "2.0"')
        return rpc_response(None if is_notification else id_, error=err), 200
    method = item.get("method")
    if not isinstance(method, str) or not method:
        err = ProtocolError(INVALID_REQUEST, "method must be a non-empty string")
        return rpc_response(None if is_notification else id_, error=err), 200
    try:
        params = item.get("params", {})
        if params is not None and not isinstance(params, dict):
            raise invalid_params("params", "must be an object")
        tenant = (params or {}).get("tenant")
        if tenant is not None and (not isinstance(tenant, str) or not tenant):
            raise invalid_params("tenant", "must be a non-empty string")
        if header_version is None and (await ctx_for(V1, tenant)).agent.strict_version_header:
            # The agent's strict switch: no A2A-Version header means 0.3 (§3.6.2). Lenient
            # (the default): the method name says which version it is.
            header_version = V03
        version, op_name = _method_version(method, header_version)
        tracing.name_operation(op_name)
        if in_batch and op_name in STREAMING_OPERATIONS:
            raise ProtocolError(INVALID_REQUEST, f"{method} cannot be sent inside a batch")
        ctx = await ctx_for(version, tenant)
        if op_name in STREAMING_OPERATIONS:
            stream = await open_stream(ctx, op_name, params or {}, last_event_id, rpc_id=id_)
            if is_notification:
                await stream.discard()  # nobody listens; what it wrote stays written
                return None, 204
            return stream, 200
        if version == V03:
            result = await v03.call(ctx, op_name, params or {})
        else:
            result = await METHODS[op_name](ctx, params or {})
    except Exception as exc:
        error = as_protocol_error(exc)
        if is_notification:
            return None, 204
        answer = rpc_response(id_, error=error)
        if version == V03:
            answer["error"] = v03.jsonrpc_error(error)
        answer["_headers"] = error.headers()
        # A stream refused for capacity is a transport-level refusal (503 + Retry-After on
        # both bindings): a load balancer or client may retry it elsewhere.
        return answer, 503 if error.reason in sse.CAPACITY_REASONS else _http_status(error)
    if is_notification:
        return None, 204
    return rpc_response(id_, result=result), 200


def _method_version(method: str, header_version: str | None) -> tuple[str, str]:
    if header_version in (None, V1) and method in METHODS:
        return V1, method
    if header_version in (None, V03) and method in v03.METHODS:
        return V03, v03.METHODS[method]
    raise ProtocolError(
        METHOD_NOT_FOUND,
        f"method {method[:80]!r} not found"
        + (f" for A2A-Version {header_version}" if header_version else ""),
    )
