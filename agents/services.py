"""Writes of the agents app: agents and API keys (each one transaction)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from a2a_platform.lib.crypto import token_digest, token_matches, token_new, token_prefix
from agents.models import RESERVED_SLUGS, Agent, ApiKey, ApiKeyKind
from agents.signing import signing_key_create_for_new_agent

TOKEN_PREFIX = "a2a"


class AgentError(Exception):
    """Bad agent or key input (an operator's mistake), with a message to show them."""


def validate_slug(slug: str) -> None:
    if slug.lower() in RESERVED_SLUGS:
        raise AgentError(f"slug {slug!r} is reserved: it collides with a route")


def agent_create(
    *,
    slug: str,
    name: str,
    description: str,
    executor: str = "echo",
    auth_mode: str = "public",
    is_default: bool = False,
    **fields: Any,
) -> Agent:
    """Create an agent (a tenant) with its first signing key. `is_default` moves the
    origin-root role to it.

    One outermost transaction (durable: no caller may fold it into its own): the agent, its
    active signing key (so its card is signed and its JWKS lists a key from the first read).
    """
    validate_slug(slug)
    fields.setdefault("default_input_modes", ["text/plain"])
    fields.setdefault("default_output_modes", ["text/plain"])
    agent = Agent(
        slug=slug,
        name=name,
        description=description,
        executor=executor,
        auth_mode=auth_mode,
        is_default=is_default,
        **fields,
    )
    try:
        # The single-default constraint is checked by the database after the old default is
        # demoted below; validated here it would refuse every `is_default` while one exists.
        agent.full_clean(validate_constraints=not is_default)
    except ValidationError as exc:
        problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
        raise AgentError(problems) from None
    with transaction.atomic(durable=True):
        if is_default:
            Agent.objects.filter(is_default=True).update(is_default=False)
        agent.save()
        signing_key_create_for_new_agent(agent)
    return agent


@dataclass(frozen=True)
class NewApiKey:
    key: ApiKey
    token: str  # shown once; only its digest is stored


def api_key_create(*, agent: Agent, name: str, kind: str = ApiKeyKind.CLIENT) -> NewApiKey:
    """A random 256-bit token `a2a_<prefix>_<secret>`; only its SHA-256 digest is stored."""
    if kind not in ApiKeyKind.values:
        raise AgentError(f"kind must be one of {', '.join(ApiKeyKind.values)}")
    prefix, token = token_new(TOKEN_PREFIX)
    key = ApiKey.objects.create(
        agent=agent, kind=kind, name=name[:200], prefix=prefix, digest=token_digest(token)
    )
    return NewApiKey(key=key, token=token)


def api_key_revoke(*, key_id: object) -> ApiKey:
    """Revoke a key (idempotent): refused everywhere within A2A_API_KEY_CACHE_SECONDS.

    Outermost (durable): the admin action calls it once per key, each its own transaction.
    """
    with transaction.atomic(durable=True):
        key = ApiKey.objects.select_for_update().get(pk=key_id)
        if key.revoked_at is None:
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked_at"])
    return key


def api_key_authenticate(token: str, *, kind: str) -> ApiKey | None:
    """The live key of `kind` this token belongs to, or None. Constant-time digest compare."""
    prefix = token_prefix(token, TOKEN_PREFIX)
    if prefix is None:
        return None
    key = (
        ApiKey.objects.select_related("agent")
        .filter(prefix=prefix, kind=kind, revoked_at__isnull=True)
        .first()
    )
    if key is None or not token_matches(key.digest, token):
        return None
    now = timezone.now()
    # Bookkeeping write throttled to once a minute per key.
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


def agent_save(*, agent: Agent) -> Agent:
    """Save an agent edited in the admin: reserved slugs refused, one default at a time; an
    agent added there gets its first signing key in the same transaction.

    Not durable: the admin's change form runs it inside its own transaction.
    """
    validate_slug(agent.slug)
    adding = agent._state.adding
    with transaction.atomic():
        if agent.is_default:
            Agent.objects.filter(is_default=True).exclude(pk=agent.pk).update(is_default=False)
        agent.save()
        if adding:
            signing_key_create_for_new_agent(agent)
    return agent
