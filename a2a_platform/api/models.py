"""The management API's own rows: integrators' tokens and Idempotency-Key claims."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class TokenScope(models.TextChoices):
    """What a token may do; a2a_platform/api/scopes.py maps each to Django permissions."""

    READ = "read", "read (view everything, change nothing)"
    OPERATE = "operate", "operate (also pause, resume, resolve, replay, manage agents and keys)"
    REBIND = "rebind", "rebind (also start, cut over, extend and abort rebinds)"


class ApiToken(models.Model):
    """An integrator's bearer token `a2apt_<prefix>_<secret>`, stored as its SHA-256 digest and
    found by its public prefix (a2a_platform/lib/crypto.py). The secret is shown once.

    It acts as `user` with at most its scope's permissions (never more than the user's)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    scope = models.CharField(max_length=16, choices=TokenScope.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}, {self.scope})"


class IdempotencyKey(models.Model):
    """A creating POST's `Idempotency-Key`, claimed by its principal (token or user) before the
    request runs, then holding the first response (status and body) for 24 hours."""

    principal = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    fingerprint = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="api_idempotency_key_once")
        ]

    def __str__(self) -> str:
        return f"{self.principal}: {self.key}"
