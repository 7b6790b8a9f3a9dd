"""Reads the management API renders: its own rows (tokens), and an agent's keys."""

from __future__ import annotations

from django.db.models import QuerySet

from a2a_platform.api.models import ApiToken
from agents.models import ApiKey, SigningKey


def token_list() -> QuerySet[ApiToken]:
    return ApiToken.objects.select_related("user", "created_by")


def token_get(pk: object) -> ApiToken | None:
    return token_list().filter(pk=pk).first()


def agent_api_keys(slug: str) -> QuerySet[ApiKey]:
    return ApiKey.objects.select_related("agent").filter(agent__slug=slug)


def agent_signing_keys(slug: str) -> QuerySet[SigningKey]:
    """Public parts are rendered from these; the private key column is never read out."""
    return SigningKey.objects.filter(agent__slug=slug).defer("private_key_encrypted")
