"""The A2A wire surface as a small ASGI app beside Django: the entry point asgi.py routes to.

Resolve the route (routes.py), refuse a Host outside ALLOWED_HOSTS and a method the path does
not take, then hand the request to its binding: jsonrpc.py (JSON-RPC 2.0, `application/json`),
http_json.py (HTTP+JSON, `application/a2a+json`) or discovery.py (the Agent Card and the
JWKS). What the bindings share is binding.py; v0.3 shapes are v03.py; the operations
(operations.py, streams.py) know no binding. Served outside Django's request cycle so a
blocking SendMessage or an SSE stream holds no thread and no database connection while it
waits.
"""

from __future__ import annotations

import functools

from django.conf import settings
from django.http.request import split_domain_port, validate_host
from starlette.requests import Request
from starlette.responses import Response

from a2a_platform.lib import tracing
from a2a_platform.protocol import discovery, http_json, jsonrpc
from a2a_platform.protocol.binding import request_host, rest_error
from a2a_platform.protocol.errors import (
    INVALID_REQUEST,
    METHOD_NOT_ALLOWED,
    ProtocolError,
    from_domain,
)
from a2a_platform.protocol.routes import Route, resolve


def route_for(scope) -> Route | None:
    """The protocol route of an HTTP request, or None (Django serves it)."""
    if scope["type"] != "http":
        return None
    return resolve(scope["method"], scope["path"])


async def handle(route: Route, scope, receive, send) -> None:
    request = Request(scope, receive)
    # The request's span (the caller's `traceparent` its parent): a task it opens continues
    # that trace (writes.accept_message), its answer streamed included.
    attributes = {
        "http.request.method": scope["method"],
        "url.path": scope["path"],
        "a2a.binding": "JSONRPC" if route.name == "jsonrpc" else "HTTP+JSON",
    }
    if route.name != "jsonrpc":  # a JSON-RPC request names its method once parsed
        attributes["rpc.method"] = route.name
    with tracing.server_request(request.headers, f"A2A {route.name}", attributes) as span:
        await _handle(request, route, scope, receive, send, span)


async def _handle(request: Request, route: Route, scope, receive, send, span) -> None:
    if not _host_allowed(request):
        # As Django answers its own views: URLs built from this Host (the card's interfaces,
        # a webhook JWT's issuer) must not be the client's choice.
        refusal = ProtocolError(INVALID_REQUEST, "the request's Host is not in ALLOWED_HOSTS")
        response = rest_error(refusal, legacy=route.legacy)
    elif not route.method_allowed:
        response = _method_not_allowed(request, route)
    else:
        try:
            response = await _dispatch(request, route)
        except Exception as exc:
            # The bindings render their operations' errors; what escapes them (the card's or
            # the JWKS's reads while the database is down) is mapped here, or is a bug.
            mapped = from_domain(exc)
            if mapped is None:
                raise
            response = rest_error(mapped, legacy=route.legacy)
    # An SSE stream (sse.SSEResponse) always starts 200.
    span.set_attribute("http.response.status_code", getattr(response, "status_code", 200))
    await response(scope, receive, send)


async def _dispatch(request: Request, route: Route) -> Response:
    if route.name == "jsonrpc":
        return await jsonrpc.handle(request, route)
    if route.name == "card":
        return await discovery.card(request, route)
    if route.name == "jwks":
        return await discovery.jwks(request, route)
    return await http_json.handle(request, route)


def _host_allowed(request: Request) -> bool:
    if settings.A2A_PUBLIC_BASE_URL:  # URLs come from the setting, whatever the Host says
        return True
    return _host_valid(request_host(request), tuple(settings.ALLOWED_HOSTS))


@functools.lru_cache(maxsize=256)
def _host_valid(host: str, allowed: tuple[str, ...]) -> bool:
    """Django's own Host check, remembered per Host header (a few per deployment; bounded,
    so a client sending a new Host each time costs the check, not memory)."""
    return validate_host(split_domain_port(host)[0], allowed)


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
    response = rest_error(ProtocolError(METHOD_NOT_ALLOWED, message), legacy=route.legacy)
    response.headers["Allow"] = allow
    return response
