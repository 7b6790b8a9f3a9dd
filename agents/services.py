"""Writes of the agents app: agents and API keys, each one transaction that also writes its
`OperatorAction` (who: `actor`, the admin's user, `api:<user>` or the command; "system" when no
operator asked, as a demo seed or a test does)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from google.protobuf import json_format

from a2a_platform.lib.crypto import token_digest, token_matches, token_new, token_prefix
from agents.card_render import render_card
from agents.models import RESERVED_SLUGS, Agent, ApiKey, ApiKeyKind, MetricBase, OperatorAction
from agents.signing import signing_key_create_for_new_agent

TOKEN_PREFIX = "a2a"
SYSTEM_ACTOR = "system"


class AgentError(Exception):
    """Bad agent or key input (an operator's mistake), with a message to show them and, when
    known, the offending fields (`{field: [problem, ...]}`)."""

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or {}


def validate_slug(slug: str) -> None:
    if slug.lower() in RESERVED_SLUGS:
        problem = "reserved: it collides with a route"
        raise AgentError(f"slug {slug!r} is {problem}", fields={"slug": [problem]})


# What an operator may set on an agent through any interface (the admin's form has the same
# fields); the slug is fixed once the agent exists (its URLs, its clients' configs).
EDITABLE_FIELDS = frozenset(
    {
        "name",
        "description",
        "version",
        "provider_organization",
        "provider_url",
        "documentation_url",
        "skills",
        "default_input_modes",
        "default_output_modes",
        "extensions",
        "push_notifications_enabled",
        "streaming_enabled",
        "card_max_age",
        "push_rebind_policy",
        "push_rebind_deadline",
        "push_rebind_on_timeout",
        "push_rebind_min_overlap",
        "executor",
        "auth_mode",
        "anonymous_list_tasks",
        "strict_version_header",
        "is_default",
        "enabled",
    }
)


def agent_check(agent: Agent) -> None:
    """The rules every interface's agent edit obeys, beyond the model's own validation: the
    slug is not a route, the default drain deadline is one a rebind may have, and the card
    renders (skills, modes and extensions are A2A objects: a card that cannot be rendered
    would answer its clients with a 500). Raises AgentError naming the field."""
    validate_slug(agent.slug)
    limit = settings.A2A_REBIND_MAX_DEADLINE_SECONDS
    if not 1 <= agent.push_rebind_deadline <= limit:
        problem = f"between 1 and {limit} seconds"
        raise AgentError(
            f"push_rebind_deadline: {problem}", fields={"push_rebind_deadline": [problem]}
        )
    for field in ("skills", "default_input_modes", "default_output_modes", "extensions"):
        if not isinstance(getattr(agent, field), list):
            raise AgentError(f"{field}: a JSON list", fields={field: ["a JSON list"]})
    try:
        render_card(agent, origin="https://agent.invalid")
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise AgentError(f"the card does not render: {exc}", fields={"card": [str(exc)]}) from None


def _full_clean(agent: Agent) -> None:
    try:
        # The single-default constraint is checked by the database after the old default is
        # demoted; validated here it would refuse every `is_default` while one exists.
        agent.full_clean(validate_constraints=not agent.is_default)
    except ValidationError as exc:
        problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
        raise AgentError(problems, fields=exc.message_dict) from None


def agent_create(
    *,
    slug: str,
    name: str,
    description: str,
    executor: str = "echo",
    auth_mode: str = "public",
    is_default: bool = False,
    actor: str = SYSTEM_ACTOR,
    **fields: Any,
) -> Agent:
    """Create an agent (a tenant) with its first signing key. `is_default` moves the
    origin-root role to it.

    One outermost transaction (durable: no caller may fold it into its own): the agent, its
    active signing key (so its card is signed and its JWKS lists a key from the first read),
    and its audit (`create_agent`).
    """
    validate_slug(slug)
    unknown = set(fields) - EDITABLE_FIELDS
    if unknown:
        raise AgentError(f"not agent fields: {', '.join(sorted(unknown))}")
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
    _full_clean(agent)
    agent_check(agent)
    with transaction.atomic(durable=True):
        if is_default:
            Agent.objects.filter(is_default=True).update(is_default=False)
        agent.save()
        signing_key_create_for_new_agent(agent)
        OperatorAction.record(actor, "create_agent", {"agent": agent.pk, "slug": agent.slug})
    return agent


@dataclass(frozen=True)
class NewApiKey:
    key: ApiKey
    token: str  # shown once; only its digest is stored


def api_key_create(
    *, agent: Agent, name: str, kind: str = ApiKeyKind.CLIENT, actor: str = SYSTEM_ACTOR
) -> NewApiKey:
    """A random 256-bit token `a2a_<prefix>_<secret>`; only its SHA-256 digest is stored.
    One transaction with its audit (`create_api_key`: the prefix, never the token)."""
    if kind not in ApiKeyKind.values:
        raise AgentError(f"kind must be one of {', '.join(ApiKeyKind.values)}")
    prefix, token = token_new(TOKEN_PREFIX)
    with transaction.atomic():
        key = ApiKey.objects.create(
            agent=agent, kind=kind, name=name[:200], prefix=prefix, digest=token_digest(token)
        )
        OperatorAction.record(
            actor, "create_api_key", {"agent": agent.pk, "key": str(key.pk), "prefix": prefix}
        )
    return NewApiKey(key=key, token=token)


def api_key_revoke(*, key_id: object, actor: str) -> ApiKey:
    """Revoke a key (idempotent): refused everywhere within A2A_API_KEY_CACHE_SECONDS.
    Audited once (`revoke_api_key`), in the revocation's transaction.

    Outermost (durable): the admin action calls it once per key, each its own transaction.
    """
    with transaction.atomic(durable=True):
        key = ApiKey.objects.select_for_update().get(pk=key_id)
        if key.revoked_at is None:
            key.revoked_at = timezone.now()
            key.save(update_fields=["revoked_at"])
            OperatorAction.record(
                actor,
                "revoke_api_key",
                {"agent": key.agent_id, "key": str(key.pk), "prefix": key.prefix},
            )
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


def agent_save(*, agent: Agent, actor: str) -> Agent:
    """Save an agent edited in the admin: reserved slugs refused, one default at a time; an
    agent added there gets its first signing key in the same transaction, and either is
    audited there (`create_agent` or `change_agent`).

    Not durable: the admin's change form runs it inside its own transaction.
    """
    agent_check(agent)
    adding = agent._state.adding
    with transaction.atomic():
        if agent.is_default:
            Agent.objects.filter(is_default=True).exclude(pk=agent.pk).update(is_default=False)
        agent.save()
        if adding:
            signing_key_create_for_new_agent(agent)
        OperatorAction.record(
            actor,
            "create_agent" if adding else "change_agent",
            {"agent": agent.pk, "slug": agent.slug},
        )
    return agent


def agent_update(*, agent_pk: int, changes: dict[str, Any], actor: str) -> Agent:
    """Change an agent's editable fields (EDITABLE_FIELDS; the slug stays): validated as the
    model and `agent_check` require, the default moved if `is_default` is set. Each process
    serving it sees the change within A2A_AGENT_CACHE_SECONDS (at once in this one).

    One outermost transaction, the agent row locked, with its audit (`change_agent`: the
    fields changed). Raises AgentError, Agent.DoesNotExist."""
    unknown = set(changes) - EDITABLE_FIELDS
    if unknown:
        raise AgentError(f"not editable: {', '.join(sorted(unknown))}")
    with transaction.atomic(durable=True):
        agent = Agent.objects.select_for_update(no_key=True).get(pk=agent_pk)
        for field, value in changes.items():
            setattr(agent, field, value)
        _full_clean(agent)
        agent_check(agent)
        if agent.is_default:
            Agent.objects.filter(is_default=True).exclude(pk=agent.pk).update(is_default=False)
        agent.save(update_fields=[*changes, "updated_at"])
        OperatorAction.record(
            actor,
            "change_agent",
            {"agent": agent.pk, "slug": agent.slug, "fields": sorted(changes)},
        )
    return agent


def metric_base_add(tallies: Mapping[tuple[str, int, str], int]) -> None:
    """Add `tallies` ((family, agent pk, label) -> value) to agents.MetricBase, inside the
    caller's transaction: the purge's, which deletes the rows it counted in the same one, so
    a counter (base + what is still stored) neither drops nor counts twice. Rows are created
    at zero first, then added to in key order (a fixed lock order)."""
    keys = sorted(k for k, v in tallies.items() if v)
    if not keys:
        return
    MetricBase.objects.bulk_create(
        [MetricBase(family=f, agent_id=a, label=label) for f, a, label in keys],
        ignore_conflicts=True,
    )
    for family, agent, label in keys:
        MetricBase.objects.filter(family=family, agent_id=agent, label=label).update(
            value=F("value") + tallies[(family, agent, label)]
        )
