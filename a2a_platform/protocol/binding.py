"""What the two bindings (jsonrpc.py, http_json.py) share: the caller's context built from a
request, errors rendered as HTTP+JSON responses (also the router's and the discovery
endpoints' refusals), the JSON-RPC response object (also each frame of a JSON-RPC stream),
and opening a stream framed for either binding. Their JSON bytes: lib/json_bytes.py.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from starlette.requests import Request
from starlette.responses import Response

from a2a_platform.lib.json_bytes import dumps
from a2a_platform.lib.orm import run_orm
from a2a_platform.protocol import sse, streams, v03
from a2a_platform.protocol.context import V03, CacheMiss, Ctx, build_ctx, negotiate_version
from a2a_platform.protocol.errors import (
    INTERNAL,
    ProtocolError,
    database_unreachable,
    from_domain,
)

logger = logging.getLogger(__name__)

JSONRPC_MEDIA = "application/json"
REST_MEDIA = "application/a2a+json"


def as_protocol_error(exc: Exception) -> ProtocolError:
    """`exc` as the error the client is answered with: a ProtocolError as it is, a domain error
    mapped (errors.from_domain), anything else an internal error (logged)."""
    if isinstance(exc, ProtocolError):
        return exc
    mapped = from_domain(exc)
    if mapped is not None:
        if database_unreachable(exc):
            logger.warning("database unreachable; answered with a retryable refusal", exc_info=exc)
        return mapped
    logger.error("unexpected error in protocol handler", exc_info=exc)
    return ProtocolError(INTERNAL, "internal error")


def request_host(request: Request) -> str:
    """The request's first Host header (else, absent or empty, the server's address), read
    off the scope's header lines: the card reads no other header, so no Headers mapping is
    built for it."""
    for name, value in request.scope["headers"]:
        if name == b"host":  # ASGI servers send header names lowercased
            return value.decode("latin-1") or request.url.netloc
    return request.url.netloc


def _origin(request: Request) -> str:
    if settings.A2A_PUBLIC_BASE_URL:
        return settings.A2A_PUBLIC_BASE_URL.rstrip("/")
    # The scheme from the scope: request.url would build the whole URL on every request.
    return f"{request.scope.get('scheme', 'http')}://{request_host(request)}"


async def request_ctx(
    request: Request, tenant: str | None, version: str, *, public: bool = False
) -> Ctx:
    """The caller's context (agent, auth, version, extensions): from this process's caches
    when it can, else in one short ORM call. A public read (the card) reads no header."""
    headers = {} if public else {k.lower(): v for k, v in request.headers.items()}
    kw = {"tenant": tenant, "headers": headers, "version": version, "origin": _origin(request)}
    try:
        return build_ctx(**kw, public=public, cache_only=True)
    except CacheMiss:
        return await run_orm(lambda: build_ctx(**kw, public=public))


def requested_version(request: Request) -> str | None:
    return negotiate_version(
        request.headers.get("a2a-version") or request.query_params.get("A2A-Version")
    )


def extensions_header(ctx: Ctx) -> dict[str, str]:
    """`A2A-Extensions` naming the extensions this request activated, if any."""
    if not ctx.activated_extensions:
        return {}
    return {"A2A-Extensions": ",".join(sorted(ctx.activated_extensions))}


def rest_error(exc: ProtocolError, *, legacy: bool = False) -> Response:
    """An error as an HTTP+JSON response (v0.3's body on a v0.3 URL)."""
    body = v03.rest_error(exc) if legacy else exc.rest_body()
    return Response(
        dumps(body),
        status_code=exc.kind.http_status,
        media_type="application/json" if legacy else REST_MEDIA,
        headers=exc.headers(),
    )


def rpc_response(id_: Any, *, result: Any = None, error: ProtocolError | None = None) -> dict:
    """A JSON-RPC 2.0 response object."""
    if error is not None:
        return {"jsonrpc": "2.0", "id": id_, "error": error.jsonrpc_error()}
    return {"jsonrpc": "2.0", "id": id_, "result": result}


async def open_stream(
    ctx: Ctx,
    op: str,
    params: dict[str, Any],
    last_event_id: str | None,
    *,
    rpc_id: Any = None,
    rest: bool = False,
) -> sse.SSEResponse:
    """Take a stream slot, open the operation (errors here are ordinary error responses),
    and frame its events for the binding: JSON-RPC `{"jsonrpc","id","result"}` or the bare
    StreamResponse (HTTP+JSON), v0.3 shapes for v0.3 clients; `id: <task seq>` on each."""
    slot = sse.admit()
    try:
        resume_after = streams.parse_last_event_id(last_event_id)
        if ctx.version == V03:
            stream = await v03.open_stream(ctx, op, params, rest=rest, resume_after=resume_after)
        else:
            stream = await streams.OPEN[op](ctx, params, resume_after=resume_after)
    except BaseException:
        slot.release()
        raise
    legacy = ctx.version == V03

    def render(event: streams.StreamEvent) -> sse.Frame:
        result = event.response
        if legacy:
            result = v03.stream_event(result, last=event.last, rest=rest)
        if not rest:
            result = rpc_response(rpc_id, result=result)
        return sse.Frame(dumps(result), id=event.seq)

    def render_error(error: ProtocolError) -> sse.Frame:
        if rest:
            body = v03.rest_error(error) if legacy else error.rest_body()
        else:
            body = rpc_response(rpc_id, error=error)
            if legacy:
                body["error"] = v03.jsonrpc_error(error)
        return sse.Frame(dumps(body), event="error")

    return sse.SSEResponse(
        stream, slot=slot, render=render, render_error=render_error, headers=extensions_header(ctx)
    )
