"""Discovery: the Agent Card (`/.well-known/agent-card.json`, also under the v0.3 URL) and the
JWKS that verifies the agent's webhook deliveries (`/.well-known/jwks.json`).

Both are public reads that write no key: an agent without a signing key (made outside
agent_create) is served an unsigned card and an empty JWKS. A card is served only while the
platform can keep its promises (readiness), rendered, signed and merged with the v0.3 fields
in an ORM thread, and kept per process by everything it depends on (`_cards`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import NamedTuple

from starlette.requests import Request
from starlette.responses import Response

from a2a_platform.lib.json_bytes import dumps
from a2a_platform.lib.orm import run_orm
from a2a_platform.lib.ttl_cache import TTLCache
from a2a_platform.protocol import operations, push_gate, v03, writes
from a2a_platform.protocol.binding import request_ctx, rest_error
from a2a_platform.protocol.context import V1, Ctx
from a2a_platform.protocol.errors import INTERNAL, ProtocolError
from a2a_platform.protocol.routes import Route
from agents.card_render import agent_base_url, jwks_url
from agents.card_signing import EmptyCardValue, card_version_record, sign_card
from agents.readiness import RETRY_AFTER_SECONDS
from agents.signing import jwks as agent_jwks

logger = logging.getLogger(__name__)

JSON = b"application/json"


class ServedCard(NamedTuple):
    """A rendered card as the endpoint sends it: its body, its ETag, the card version it
    recorded, when (monotonic), and its responses' header lines, built once."""

    body: bytes
    etag: str
    version: int
    recorded_at: float
    ok_headers: list[tuple[bytes, bytes]]
    not_modified_headers: list[tuple[bytes, bytes]]


class _Prepared(Response):
    """A response whose header lines are already built (a cached card's): Starlette's
    Response sends `raw_headers` as they are, so building them again on every request is
    skipped."""

    def __init__(self, status_code: int, raw_headers: list[tuple[bytes, bytes]], body=b""):
        self.status_code = status_code
        self.raw_headers = raw_headers
        self.body = body
        self.background = None


# Served cards by (agent, its last edit, origin, root, capabilities): rendering goes through
# protobuf, signing and the v0.3 models, far costlier than serving bytes. Keyed on everything
# the card depends on, so never stale; re-recorded as served at most once a minute. Beside
# them, under ("served", agent id), the card each agent was last served and what it was
# chosen from: the agent's cached row and this instance's cached readiness (each the same
# object until its own cache replaces it), the event hub's state and the origin. While all
# are the same, the same card is served without working out its capabilities and key again
# on every request (clearing the cache clears both).
_cards: TTLCache = TTLCache(lambda: 300)


async def card(request: Request, route: Route) -> Response:
    """The agent's card, with an ETag (a 304 for a match) and the agent's max-age."""
    try:
        ctx = await request_ctx(request, route.tenant, V1, public=True)
    except ProtocolError as exc:
        return rest_error(exc)
    readiness = await push_gate.readiness_now()
    if not readiness.card_servable:
        # Never ready (or shutting down): a 503 is honest, a card would be a promise we
        # cannot keep (incidents/card-published-before-dispatcher.md).
        return Response(
            dumps({"status": "not ready", "failing": readiness.failing()}),
            status_code=503,
            media_type="application/json",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Cache-Control": "no-store"},
        )
    hosted_why = readiness.agent_not_ready(ctx.agent)
    if hosted_why is not None:
        # Hosted code no live worker can load (yet): this agent's card only, every time (not
        # once-ready-stays-served like the instance's), or its tasks would wait for nobody.
        return Response(
            dumps({"status": "not ready", "failing": {"hosted_executor": hosted_why}}),
            status_code=503,
            media_type="application/json",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Cache-Control": "no-store"},
        )
    hub_connected = operations.hub_connected()
    chosen = (ctx.agent, readiness, hub_connected, ctx.origin, ctx.at_root)
    last = _cards.get(("served", ctx.agent.pk))
    if last is not None and _same_inputs(last[0], chosen) and _fresh(last[1]):
        cached = last[1]
    else:
        caps = operations.capabilities(ctx, readiness, hub=hub_connected)
        # The capabilities are part of the key: a flip serves a new card (and a new ETag).
        cache_key = (ctx.agent.pk, ctx.agent.updated_at, ctx.origin, ctx.at_root, *caps.items())
        cached = _cards.get(cache_key)
        if cached is None or not _fresh(cached):
            try:
                cached = _cards.put(cache_key, await run_orm(lambda: _served_card(ctx, caps)))
            except EmptyCardValue as exc:
                logger.error("agent card not served", extra={"agent": ctx.agent.slug}, exc_info=exc)
                return rest_error(ProtocolError(INTERNAL, "this agent's card is misconfigured"))
        _cards.put(("served", ctx.agent.pk), (chosen, cached))
    writes.card_version_served(ctx.agent.pk, cached.version)
    if_none_match = _header(request, b"if-none-match")
    # Each response its own copy of the lines: one that adds a header changes no other.
    if if_none_match and cached.etag in [t.strip() for t in if_none_match.split(",")]:
        return _Prepared(304, [*cached.not_modified_headers])
    return _Prepared(200, [*cached.ok_headers], cached.body)


def _same_inputs(last: tuple, now: tuple) -> bool:
    """(agent, readiness, hub, origin, at_root): the first two the very same objects (each
    replaced by its cache when it is read again), the rest equal."""
    return last[0] is now[0] and last[1] is now[1] and last[2:] == now[2:]


def _fresh(served: ServedCard) -> bool:
    """Re-recorded as served at most once a minute (card_version_record)."""
    return time.monotonic() - served.recorded_at < 60


def _header(request: Request, name: bytes) -> str | None:
    """A request header's first value, read off the scope's lines (no Headers mapping)."""
    for key, value in request.scope["headers"]:
        if key == name:  # ASGI servers send header names lowercased
            return value.decode("latin-1")
    return None


def _served_card(ctx: Ctx, caps: dict[str, bool]) -> ServedCard:
    """In an ORM thread: render, sign, merge the v0.3 fields, record the card version."""
    signed = sign_card(
        ctx.agent,
        operations.served_card(ctx, caps),
        jwks_url=jwks_url(agent_base_url(ctx.agent, ctx.origin, at_root=ctx.at_root)),
    )
    # v0.3 clients read top-level url/preferredTransport: merged in (v1.0 keys win; the
    # signature covers the v1.0 card, which is what v1.0 verifiers parse).
    served = v03.card(signed)
    body = dumps(served)
    digest = hashlib.sha256(body).hexdigest()
    version = card_version_record(agent=ctx.agent, content_hash=digest, card=served)
    etag = f'"{digest[:32]}"'
    # What Response(body, media_type="application/json", headers=...) would send.
    cached = [
        (b"etag", etag.encode("latin-1")),
        (b"cache-control", f"public, max-age={ctx.agent.card_max_age}".encode("latin-1")),
    ]
    ok = [*cached, (b"content-length", str(len(body)).encode()), (b"content-type", JSON)]
    return ServedCard(body, etag, version, time.monotonic(), ok, cached)


async def jwks(request: Request, route: Route) -> Response:
    """The public keys that sign this agent's webhook deliveries (all live keys: a retiring
    key stays here while it still signs)."""
    try:
        ctx = await request_ctx(request, route.tenant, V1, public=True)
    except ProtocolError as exc:
        return rest_error(exc)

    body = dumps(await run_orm(lambda: agent_jwks(ctx.agent)))
    # Cached no longer than the card: a rebind publishes its next key for at least the card's
    # max-age before it signs, so a client re-reading either learns it in time. The ETag
    # changes with every key change.
    headers = {
        "ETag": f'"{hashlib.sha256(body).hexdigest()[:32]}"',
        "Cache-Control": f"public, max-age={ctx.agent.card_max_age}",
    }
    if headers["ETag"] in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/jwk-set+json", headers=headers)
