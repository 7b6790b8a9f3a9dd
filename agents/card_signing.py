"""Served cards: signed (JWS over the RFC 8785 canonical card), free of empty values, and
recorded as card versions so an operator can tell which card a client may still trust."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import rfc8785
from django.db import IntegrityError, transaction
from django.utils import timezone
from jwt import api_jws

from agents.models import Agent, CardVersion
from agents.signing import active_signing_key, private_key

logger = logging.getLogger(__name__)

LAST_SERVED_WRITE_EVERY = timedelta(minutes=1)


class EmptyCardValue(ValueError):
    """Verifiers disagree about empty values (the SDK strips them before canonicalizing,
    the spec keeps some), so a signed card must not contain any."""


def empty_value_paths(value: Any, path: str = "") -> list[str]:
    if isinstance(value, dict):
        if not value and path:
            return [path]
        return [p for k, v in value.items() for p in empty_value_paths(v, f"{path}.{k}".strip("."))]
    if isinstance(value, list):
        if not value:
            return [path]
        return [p for i, v in enumerate(value) for p in empty_value_paths(v, f"{path}[{i}]")]
    if value == "":
        return [path]
    return []


def canonical_payload(card: dict[str, Any]) -> bytes:
    """RFC 8785 (JCS) bytes of the card without its signatures: what is signed."""
    return rfc8785.dumps({k: v for k, v in card.items() if k != "signatures"})


def sign_card(agent: Agent, card: dict[str, Any], *, jwks_url: str) -> dict[str, Any]:
    """Add a detached-payload JWS (EdDSA, the agent's active key) over the canonical card.

    Reads the key, never creates one (agents get theirs when created: agent_create,
    migration 0006). An agent without one, made outside the services, is served its card
    unsigned (signatures are optional in the card; verifiers that require one refuse it) and
    an error is logged, rather than a 500 for a read.
    """
    empty = empty_value_paths({k: v for k, v in card.items() if k != "signatures"})
    if empty:
        raise EmptyCardValue(f"empty values in the card: {', '.join(empty[:5])}")
    key = active_signing_key(agent)
    if key is None:
        logger.error("agents.card.unsigned", extra={"agent": agent.slug})
        return card
    token = api_jws.encode(
        payload=canonical_payload(card),
        key=private_key(key),
        algorithm="EdDSA",
        headers={"kid": key.kid, "typ": "JOSE", "jku": jwks_url},
    )
    protected, _, signature = token.split(".")
    return {**card, "signatures": [{"protected": protected, "signature": signature}]}


def card_version_record(*, agent: Agent, content_hash: str, card: dict[str, Any]) -> int:
    """Record that this card was served now (first time: a new version). The last-served
    time is written at most once a minute per version."""
    now = timezone.now()
    version = CardVersion.objects.filter(agent=agent, content_hash=content_hash).first()
    if version is None:
        try:
            with transaction.atomic():
                version = CardVersion.objects.create(
                    agent=agent,
                    content_hash=content_hash,
                    card=card,
                    first_served_at=now,
                    last_served_at=now,
                )
        except IntegrityError:  # another process recorded it first
            version = CardVersion.objects.get(agent=agent, content_hash=content_hash)
    elif now - version.last_served_at >= LAST_SERVED_WRITE_EVERY:
        CardVersion.objects.filter(pk=version.pk).update(last_served_at=now)
    return version.pk


def current_card_version_id(agent: Agent) -> int | None:
    """The version a task opened now is created under: the one last served."""
    return (
        CardVersion.objects.filter(agent=agent)
        .order_by("-last_served_at", "-id")
        .values_list("pk", flat=True)
        .first()
    )


def pretty(card: dict[str, Any]) -> str:
    return json.dumps(card, indent=2, ensure_ascii=False)
