"""The A2A wire surface as a small ASGI app beside Django (asgi.py routes to it).

Thin: resolve the route, read and check the body, build the caller's context, call one
operation, render. JSON-RPC answers `application/json`, HTTP+JSON `application/a2a+json`.
Served outside Django's request cycle so a blocking SendMessage or an SSE stream holds no
thread and no database connection while it waits. Streams: sse.py frames and serves them,
streams.py is the operation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from starlette.requests import Request
from starlette.responses import Response

from a2a_platform.lib.orm import run_orm
from a2a_platform.lib.ttl_cache import TTLCache
from a2a_platform.protocol import common, operations, sse, streams, v03
from a2a_platform.protocol.body import parse_json, read_body
from a2a_platform.protocol.context import (
    V03,
    V1,
    CacheMiss,
    Ctx,
    build_ctx,
    negotiate_version,
)
from a2a_platform.protocol.errors import (
    INTERNAL,
    INVALID_REQUEST,
    METHOD_NOT_ALLOWED,
    METHOD_NOT_FOUND,
    ProtocolError,
    from_domain,
    invalid_params,
)
from a2a_platform.protocol.routes import METHODS, STREAMING_OPERATIONS, Route, resolve
from agents.card_signing import EmptyCardValue
from agents.readiness import RETRY_AFTER_SECONDS

logger = logging.getLogger(__name__)

JSONRPC_MEDIA = "application/json"
REST_MEDIA = "application/a2a+json"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _as_protocol_error(exc: Exception) -> ProtocolError:
    mapped = from_domain(exc)
    if mapped is not None:
        return mapped
    logger.error("unexpected error in protocol handler", exc_info=exc)
    return ProtocolError(INTERNAL, "internal error")


def _host_allowed(request: Request) -> bool:
    if settings.A2A_PUBLIC_BASE_URL:  # URLs come from the setting, whatever the Host says
        return True
    host = request.headers.get("host") or request.url.netloc
    return validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS)


def _origin(request: Request) -> str:
    if settings.A2A_PUBLIC_BASE_URL:
        return settings.A2A_PUBLIC_BASE_URL.rstrip("/")
    return f"{request.url.scheme}://{request.headers.get('host') or request.url.netloc}"


async def _ctx(request: Request, tenant: str | None, version: str, *, public: bool = False) -> Ctx:
    headers = {k.lower(): v for k, v in request.headers.items()}
    kw = {"tenant": tenant, "headers": headers, "version": version, "origin": _origin(request)}
    try:
        return build_ctx(**kw, public=public, cache_only=True)
    except CacheMiss:
        return await run_orm(lambda: build_ctx(**kw, public=public))


def _requested_version(request: Request) -> str | None:
    return negotiate_version(
        request.headers.get("a2a-version") or request.query_params.get("A2A-Version")
    )


async def handle(route: Route, scope, receive, send) -> None:
    request = Request(scope, receive)
    if not _host_allowed(request):
        # As Django answers its own views: URLs built from this Host (the card's interfaces,
        # a webhook JWT's issuer) must not be the client's choice.
        refusal = ProtocolError(INVALID_REQUEST, "the request's Host is not in ALLOWED_HOSTS")
        response = _rest_error(refusal, legacy=route.legacy)
    elif not route.method_allowed:
        response = _method_not_allowed(request, route)
    elif route.name == "jsonrpc":
        response = await _jsonrpc(request, route)
    elif route.name == "card":
        response = await _card(request, route)
    elif route.name == "jwks":
        response = await _jwks(request, route)
    else:
        response = await _rest(request, route)
    await response(scope, receive, send)


def _method_not_allowed(request: Request, route: Route) -> Response:
    """405 with Allow, saying what the URL is for (a GET on a JSON-RPC URL, a DELETE on a
    task, ...)."""
    allow = ", ".join(sorted(route.allowed))
    if route.name == "jsonrpc":
        card = request.url.path.rstrip("/") + "/.well-known/agent-card.json"
        message = (
            f"this is a JSON-RPC 2.0 endpoint: POST a request to it (the agent card is at {card})"
        )
    else:
        message = f"{request.method} is not allowed here; this URL takes {allow}"
    response = _rest_error(ProtocolError(METHOD_NOT_ALLOWED, message), legacy=route.legacy)
    response.headers["Allow"] = allow
    return response


# --- Agent card ----------------------------------------------------------------------------


async def _card(request: Request, route: Route) -> Response:
    try:
        ctx = await _ctx(request, route.tenant, V1, public=True)
    except ProtocolError as exc:
        return _rest_error(exc)
    readiness = await common.readiness_now()
    if not readiness.card_servable:
        # Never ready (or shutting down): a 503 is honest, a card would be a promise we
        # cannot keep (incidents/card-published-before-dispatcher.md).
        return Response(
            _dumps({"status": "not ready", "failing": readiness.failing()}),
            status_code=503,
            media_type="application/json",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Cache-Control": "no-store"},
        )
    caps = operations.capabilities(ctx, readiness)
    # The capabilities are part of the key: a flip serves a new card (and a new ETag).
    cache_key = (ctx.agent.pk, ctx.agent.updated_at, ctx.origin, ctx.at_root, *caps.items())
    cached = _cards.get(cache_key)
    if cached is None or time.monotonic() - cached[3] >= 60:
        try:
            cached = _cards.put(cache_key, await run_orm(lambda: _served_card(ctx, caps)))
        except EmptyCardValue as exc:
            logger.error("agent card not served", extra={"agent": ctx.agent.slug}, exc_info=exc)
            return _rest_error(ProtocolError(INTERNAL, "this agent's card is misconfigured"))
    body, etag = cached[0], cached[1]
    common.card_version_served(ctx.agent.pk, cached[2])
    headers = {"ETag": etag, "Cache-Control": f"public, max-age={ctx.agent.card_max_age}"}
    if etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


async def _jwks(request: Request, route: Route) -> Response:
    """The public keys that sign this agent's webhook deliveries (all live keys: a retiring
    key stays here while it still signs). A read only: an agent without a key (made outside
    agent_create) is served an empty set."""
    from agents.signing import jwks

    try:
        ctx = await _ctx(request, route.tenant, V1, public=True)
    except ProtocolError as exc:
        return _rest_error(exc)

    return Response(
        _dumps(await run_orm(lambda: jwks(ctx.agent))),
        media_type="application/jwk-set+json",
        headers={"Cache-Control": "public, max-age=300"},
    )


# --- JSON-RPC ------------------------------------------------------------------------------


# Served cards by (agent, its last edit, origin, root, capabilities): rendering goes through
# protobuf, signing and the v0.3 models, far costlier than serving bytes. Keyed on everything
# the card depends on, so never stale; re-recorded as served at most once a minute.
_cards: TTLCache[tuple[bytes, str, int, float]] = TTLCache(lambda: 300)


def _served_card(ctx: Ctx, caps: dict[str, bool]) -> tuple[bytes, str, int, float]:
    """In an ORM thread: render, sign, merge the v0.3 fields, record the card version."""
    from agents.card_render import agent_base_url
    from agents.card_signing import card_version_record, sign_card

    jwks_url = agent_base_url(ctx.agent, ctx.origin, at_root=ctx.at_root).rstrip("/")
    card = sign_card(
        ctx.agent,
        operations.public_card(ctx, caps),
        jwks_url=f"{jwks_url}/.well-known/jwks.json",
    )
    # v0.3 clients read top-level url/preferredTransport: merged in (v1.0 keys win; the
    # signature covers the v1.0 card, which is what v1.0 verifiers parse).
    served = v03.card(card)
    body = _dumps(served)
    digest = hashlib.sha256(body).hexdigest()
    version = card_version_record(agent=ctx.agent, content_hash=digest, card=served)
    return body, f'"{digest[:32]}"', version, time.monotonic()


def _rpc_response(id_: Any, *, result: Any = None, error: ProtocolError | None = None) -> dict:
    if error is not None:
        return {"jsonrpc": "2.0", "id": id_, "error": error.jsonrpc_error()}
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def _http_status(error: ProtocolError) -> int:
    # JSON-RPC errors travel with HTTP 200 (temporary refusals carry a RetryInfo detail and a
    # Retry-After header), except the transport-level refusals a proxy or client library must
    # see: too large, unauthenticated.
    return error.kind.http_status if error.kind.http_status in (401, 413) else 200


async def _jsonrpc(request: Request, route: Route) -> Response:
    try:
        header_version = _requested_version(request)
        if route.legacy and header_version != V1:
            # The v0.3 URL speaks 0.3 unless the client asks for 1.0 (§3.6.2: a server
            # processes a request with the semantics of the version it names).
            header_version = V03
        payload = parse_json(await read_body(request))
    except ProtocolError as exc:
        return Response(
            _dumps(_rpc_response(None, error=exc)),
            status_code=_http_status(exc),
            media_type=JSONRPC_MEDIA,
            headers=exc.headers(),
        )
    ctx_cache: dict[tuple[str, str | None], Ctx] = {}

    async def ctx_for(version: str, tenant: str | None) -> Ctx:
        # At the origin root, `params.tenant` names the agent; under /{slug} the path wins.
        tenant = route.tenant or tenant
        if (version, tenant) not in ctx_cache:
            ctx_cache[version, tenant] = await _ctx(request, tenant, version)
        return ctx_cache[version, tenant]

    if isinstance(payload, list):
        if not payload:
            err = ProtocolError(INVALID_REQUEST, "empty batch")
            return Response(_dumps(_rpc_response(None, error=err)), media_type=JSONRPC_MEDIA)
        if len(payload) > settings.A2A_JSONRPC_MAX_BATCH:
            err = ProtocolError(
                INVALID_REQUEST,
                f"batch of {len(payload)} exceeds the limit of {settings.A2A_JSONRPC_MAX_BATCH}",
            )
            return Response(_dumps(_rpc_response(None, error=err)), media_type=JSONRPC_MEDIA)
        answers = []
        for item in payload:
            answer, _ = await _rpc_one(item, header_version, ctx_for, in_batch=True)
            if answer is not None:
                answers.append(answer)
        if not answers:
            return Response(status_code=204)
        return Response(_dumps(answers), media_type=JSONRPC_MEDIA)

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
    return Response(_dumps(answer), status_code=status, media_type=JSONRPC_MEDIA, headers=headers)


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
        return _rpc_response(None, error=ProtocolError(INVALID_REQUEST, "not an object")), 200
    id_ = item.get("id")
    is_notification = "id" not in item
    if not (
        id_ is None or isinstance(id_, str) or (isinstance(id_, int) and not isinstance(id_, bool))
    ):
        err = ProtocolError(INVALID_REQUEST, "id must be a string, a number or null")
        return _rpc_response(None, error=err), 200
    version = header_version or V1
    # JSON-RPC 2.0 §4.1 and §5: only a valid Request without an id is a notification; one
    # that is not a valid Request is answered with an error whose id is null.
    if item.get("jsonrpc") != "2.0":
        err = ProtocolError(INVALID_REQUEST, 'jsonrpc must be "2.0"')
        return _rpc_response(None if is_notification else id_, error=err), 200
    method = item.get("method")
    if not isinstance(method, str) or not method:
        err = ProtocolError(INVALID_REQUEST, "method must be a non-empty string")
        return _rpc_response(None if is_notification else id_, error=err), 200
    try:
        params = item.get("params", {})
        if params is not None and not isinstance(params, dict):
            raise invalid_params("params", "must be an object")
        version, op_name = _method_version(method, header_version)
        if in_batch and op_name in STREAMING_OPERATIONS:
            raise ProtocolError(INVALID_REQUEST, f"{method} cannot be sent inside a batch")
        tenant = (params or {}).get("tenant")
        if tenant is not None and (not isinstance(tenant, str) or not tenant):
            raise invalid_params("tenant", "must be a non-empty string")
        ctx = await ctx_for(version, tenant)
        if op_name in STREAMING_OPERATIONS:
            stream = await _open_stream(ctx, op_name, params or {}, last_event_id, rpc_id=id_)
            if is_notification:
                await stream.discard()  # nobody listens; what it wrote stays written
                return None, 204
            return stream, 200
        if version == V03:
            result = await v03.call(ctx, op_name, params or {})
        else:
            result = await METHODS[op_name](ctx, params or {})
    except Exception as exc:
        error = exc if isinstance(exc, ProtocolError) else _as_protocol_error(exc)
        if is_notification:
            return None, 204
        answer = _rpc_response(id_, error=error)
        if version == V03:
            answer["error"] = v03.jsonrpc_error(error)
        answer["_headers"] = error.headers()
        # A stream refused for capacity is a transport-level refusal (503 + Retry-After on
        # both bindings): a load balancer or client may retry it elsewhere.
        return answer, 503 if error.reason in sse.CAPACITY_REASONS else _http_status(error)
    if is_notification:
        return None, 204
    return _rpc_response(id_, result=result), 200


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


# --- HTTP+JSON -----------------------------------------------------------------------------


def _rest_error(exc: ProtocolError, *, legacy: bool = False) -> Response:
    body = v03.rest_error(exc) if legacy else exc.rest_body()
    return Response(
        _dumps(body),
        status_code=exc.kind.http_status,
        media_type="application/json" if legacy else REST_MEDIA,
        headers=exc.headers(),
    )


_INT_QUERY = {"pageSize", "historyLength"}
_BOOL_QUERY = {"includeArtifacts"}


def _query_params(request: Request) -> dict[str, Any]:
    params: dict[str, Any] = {}
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


async def _rest(request: Request, route: Route) -> Response:
    try:
        version = V03 if route.legacy else (_requested_version(request) or V1)
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
        ctx = await _ctx(request, route.tenant, version)
        if route.name in STREAMING_OPERATIONS:
            last_event_id = request.headers.get("last-event-id")
            return await _open_stream(ctx, route.name, params, last_event_id, rest=True)
        if version == V03:
            result = await v03.call(ctx, route.name, params, rest=True)
        else:
            result = await METHODS[route.name](ctx, params)
    except Exception as exc:
        error = exc if isinstance(exc, ProtocolError) else _as_protocol_error(exc)
        return _rest_error(error, legacy=route.legacy)
    headers = {}
    if ctx.activated_extensions:
        headers["A2A-Extensions"] = ",".join(sorted(ctx.activated_extensions))
    media = "application/json" if route.legacy else REST_MEDIA
    return Response(_dumps(result), media_type=media, headers=headers)


# --- Streams (SSE) ---------------------------------------------------------------------------


async def _open_stream(
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
            result = _rpc_response(rpc_id, result=result)
        return sse.Frame(_dumps(result), id=event.seq)

    def render_error(error: ProtocolError) -> sse.Frame:
        if rest:
            body = v03.rest_error(error) if legacy else error.rest_body()
        else:
            body = _rpc_response(rpc_id, error=error)
            if legacy:
                body["error"] = v03.jsonrpc_error(error)
        return sse.Frame(_dumps(body), event="error")

    headers = {}
    if ctx.activated_extensions:
        headers["A2A-Extensions"] = ",".join(sorted(ctx.activated_extensions))
    return sse.SSEResponse(
        stream, slot=slot, render=render, render_error=render_error, headers=headers
    )


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


def route_for(scope) -> Route | None:
    if scope["type"] != "http":
        return None
    return resolve(scope["method"], scope["path"])
