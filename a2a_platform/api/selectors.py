"""Reads of the management API's own rows (tokens)."""

from __future__ import annotations

from django.db.models import QuerySet

from a2a_platform.api.models import ApiToken


def token_list() -> QuerySet[ApiToken]:
    return ApiToken.objects.select_related("user", "created_by")


def token_get(pk: object) -> ApiToken | None:
    return token_list().filter(pk=pk).first()
