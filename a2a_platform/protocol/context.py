"""Who is calling which agent, in which protocol version: resolved once per request."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from a2a_platform.lib.ttl_cache import TTLCache
from a2a_platform.protocol.errors import (
    EXTENSION_SUPPORT_REQUIRED,
    UNAUTHENTICATED,
    VERSION_NOT_SUPPORTED,
    Kind,
    ProtocolError,
)
from agents.card_render import API_KEY_HEADER, declared_extensions, required_extensions
from agents.models import Agent, ApiKey, ApiKeyKind, AuthMode
from agents.selectors import agent_by_slug, default_agent
from agents.services import api_key_authenticate

ANONYMOUS = "anonymous"
V1 = "1.0"
V03 = "0.3"
AGENT_NOT_FOUND = Kind("AGENT_NOT_FOUND", -32601, 404, "NOT_FOUND", "No such agent", "a2a-platform")

_VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.\d+)?\s*$")


@dataclass
class Ctx:
    agent: Agent
    principal: str
    authenticated: bool
    version: str
    origin: str
    at_root: bool
    extensions: set[str] = field(default_factory=set)

    @property
    def activated_extensions(self) -> set[str]:
        return self.extensions & declared_extensions(self.agent)


def negotiate_version(header: str | None) -> str | None:
    """'1.0' for any 1.x, '0.3' for 0.3, None when absent; anything else is refused."""
    if header is None or not header.strip():
        return None
    match = _VERSION.match(header)
    if match and match.group(1) == "1":
        return V1
    if match and (match.group(1), match.group(2)) == ("0", "3"):
        return V03
    raise ProtocolError(
        VERSION_NOT_SUPPORTED,
        f"A2A-Version {header.strip()[:20]!r} is not supported; use 1.0 or 0.3",
        metadata={"supported": "1.0,0.3"},
    )


def parse_extensions(header: str | None) -> set[str]:
    if not header:
        return set()
    return {uri.strip() for uri in header.split(",") if uri.strip()}


# Per process: another process's agent edit or key revocation is seen here within
# A2A_AGENT_CACHE_SECONDS / A2A_API_KEY_CACHE_SECONDS; one saved in this process (the admin, a
# service, a command) drops this process's entries when it commits (the receivers below).
_agents: TTLCache[Agent] = TTLCache(lambda: settings.A2A_AGENT_CACHE_SECONDS)
_keys: TTLCache[tuple[int, str]] = TTLCache(lambda: settings.A2A_API_KEY_CACHE_SECONDS)


def _agent_changed(sender, using: str = "default", **_) -> None:
    # Keyed by tenant (slug, or None for the default agent): an edit may change the slug or
    # move the default role (with a queryset update), so every entry goes. Agents change
    # rarely; the next request per tenant reads them again.
    transaction.on_commit(_agents.clear, using=using)


def _api_key_changed(sender, instance: ApiKey, using: str = "default", **_) -> None:
    digest = bytes.fromhex(instance.digest)  # the cache key: sha256(token), raw
    transaction.on_commit(lambda: _keys.discard(digest), using=using)


post_save.connect(_agent_changed, sender=Agent, dispatch_uid="protocol.context.agent_saved")
post_delete.connect(_agent_changed, sender=Agent, dispatch_uid="protocol.context.agent_deleted")
post_save.connect(_api_key_changed, sender=ApiKey, dispatch_uid="protocol.context.key_saved")
post_delete.connect(_api_key_changed, sender=ApiKey, dispatch_uid="protocol.context.key_deleted")


class CacheMiss(Exception):
    """build_ctx(cache_only=True) needs the database."""


def resolve_agent(tenant: str | None, *, cache_only: bool = False) -> Agent:
    agent = _agents.get(tenant)
    if agent is None and cache_only:
        raise CacheMiss
    if agent is None:
        agent = default_agent() if tenant is None else agent_by_slug(tenant)
        if agent is not None:
            _agents.put(tenant, agent)
    if agent is None:
        what = "no default agent is configured" if tenant is None else f"no agent {tenant!r}"
        raise ProtocolError(AGENT_NOT_FOUND, what)
    return agent


def _token(authorization: str | None, api_key: str | None) -> str | None:
    if api_key and api_key.strip():
        return api_key.strip()
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return None


def authenticate(
    agent: Agent, headers: dict[str, str], *, cache_only: bool = False
) -> tuple[str, bool]:
    """(principal, authenticated). A presented but invalid key is refused, never downgraded."""
    token = _token(headers.get("authorization"), headers.get(API_KEY_HEADER.lower()))
    if token is not None:
        digest = hashlib.sha256(token.encode()).digest()
        cached = _keys.get(digest)
        if cached is None and cache_only:
            raise CacheMiss
        if cached is None:
            key = api_key_authenticate(token, kind=ApiKeyKind.CLIENT)
            if key is not None:
                cached = _keys.put(digest, (key.agent_id, key.principal))
        if cached is None or cached[0] != agent.pk:
            raise ProtocolError(UNAUTHENTICATED, "invalid or revoked API key for this agent")
        return cached[1], True
    if agent.auth_mode == AuthMode.PUBLIC:
        return ANONYMOUS, False
    raise ProtocolError(
        UNAUTHENTICATED,
        f"this agent requires an API key (Authorization: Bearer, or {API_KEY_HEADER})",
    )


def build_ctx(
    *,
    tenant: str | None,
    headers: dict[str, str],
    version: str,
    origin: str,
    public: bool = False,
    cache_only: bool = False,
) -> Ctx:
    """Runs in an ORM thread, or in the event loop with `cache_only` (raises CacheMiss when
    the database is needed). `public`: the agent card, which needs no credentials."""
    agent = resolve_agent(tenant, cache_only=cache_only)
    if public:
        return Ctx(agent, ANONYMOUS, False, version, origin, at_root=tenant is None)
    principal, authenticated = authenticate(agent, headers, cache_only=cache_only)
    extensions = parse_extensions(headers.get("a2a-extensions") or headers.get("x-a2a-extensions"))
    missing = required_extensions(agent) - extensions
    if missing:
        raise ProtocolError(
            EXTENSION_SUPPORT_REQUIRED,
            "activate the required extensions with the A2A-Extensions header",
            metadata={"required": ",".join(sorted(missing))},
        )
    return Ctx(
        agent=agent,
        principal=principal,
        authenticated=authenticated,
        version=version,
        origin=origin,
        at_root=tenant is None,
        extensions=extensions,
    )
