"""Writes of the management API's own rows: tokens (create, revoke, the bookkeeping of a use)
and Idempotency-Key claims (claim, record, release, purge). Each one transaction."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from a2a_platform.api.models import ApiToken, IdempotencyKey, TokenScope
from a2a_platform.lib.crypto import token_digest, token_matches, token_new, token_prefix
from agents.models import OperatorAction

TOKEN_LABEL = "a2apt"
# Idempotency-Key claims are kept this long (then purged by the beat job).
IDEMPOTENCY_TTL = dt.timedelta(hours=24)


class TokenRefused(Exception):
    """A token request an operator may not make (with the field it concerns)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class NewApiToken:
    token: ApiToken
    secret: str  # shown once; only its digest is stored


def api_token_create(
    *,
    name: str,
    scope: str,
    user: AbstractBaseUser,
    created_by: AbstractBaseUser | None,
    expires_at: dt.datetime | None = None,
) -> NewApiToken:
    """A token acting as `user` within `scope`. Only a superuser makes one for another user
    (a token never lends its creator the permissions of someone else). Audited.

    Raises TokenRefused (scope, user, expiresAt, name)."""
    if scope not in TokenScope.values:
        raise TokenRefused("scope", f"one of {', '.join(TokenScope.values)}")
    if not name.strip():
        raise TokenRefused("name", "a token needs a name (who it is for)")
    if created_by is not None and created_by.pk != user.pk and not created_by.is_superuser:
        raise TokenRefused("user", "only a superuser makes a token for another user")
    if not user.is_active:
        raise TokenRefused("user", "the user is inactive")
    if expires_at is not None and expires_at <= timezone.now():
        raise TokenRefused("expiresAt", "must be in the future")
    prefix, secret = token_new(TOKEN_LABEL)
    with transaction.atomic():
        token = ApiToken.objects.create(
            name=name[:200],
            scope=scope,
            user=user,
            prefix=prefix,
            digest=token_digest(secret),
            created_by=created_by,
            expires_at=expires_at,
        )
        OperatorAction.record(
            _actor(created_by),
            "api_token_create",
            {"token": str(token.pk), "prefix": prefix, "scope": scope, "user": user.pk},
        )
    return NewApiToken(token=token, secret=secret)


def api_token_revoke(*, token_id: object, actor: str) -> ApiToken:
    """Revoke a token (idempotent; refused from its next request on). Audited once."""
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().get(pk=token_id)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            OperatorAction.record(
                actor, "api_token_revoke", {"token": str(token.pk), "prefix": token.prefix}
            )
    return token


def api_token_authenticate(secret: str) -> ApiToken | None:
    """The live token (not revoked, not expired, its user active) this secret belongs to, or
    None. Constant-time digest compare; `last_used_at` written at most once a minute."""
    prefix = token_prefix(secret, TOKEN_LABEL)
    if prefix is None:
        return None
    token = ApiToken.objects.select_related("user").filter(prefix=prefix).first()
    if token is None or not token_matches(token.digest, secret):
        return None
    now = timezone.now()
    if token.revoked_at is not None or (token.expires_at is not None and token.expires_at <= now):
        return None
    if not token.user.is_active:
        return None
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def _actor(user: AbstractBaseUser | None) -> str:
    return f"api:{user.get_username()}" if user is not None else "command"


# --- Idempotency-Key ------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """The outcome of claiming a key: `row` is ours to run (`fresh`), or the earlier one."""

    row: IdempotencyKey
    fresh: bool


def idempotency_claim(
    *, principal: str, key: str, method: str, path: str, fingerprint: str
) -> Claim:
    """Claim (principal, key) before the request runs: the unique row is committed first, so
    of concurrent duplicates exactly one runs; the others find its row (still without a
    response while it runs). An expired row is replaced."""
    now = timezone.now()
    for _ in range(2):
        try:
            with transaction.atomic():
                row = IdempotencyKey.objects.create(
                    principal=principal, key=key, method=method, path=path, fingerprint=fingerprint
                )
            return Claim(row=row, fresh=True)
        except IntegrityError:
            row = IdempotencyKey.objects.filter(principal=principal, key=key).first()
            if row is None:
                continue  # released or purged in between: claim again
            if row.created_at + IDEMPOTENCY_TTL <= now:
                IdempotencyKey.objects.filter(pk=row.pk, created_at=row.created_at).delete()
                continue
            return Claim(row=row, fresh=False)
    raise RuntimeError("idempotency key claim kept changing under us")  # pragma: no cover


def idempotency_record(*, claim_id: int, status_code: int, response: object) -> None:
    """Keep the first response of a claimed key (what a retry is answered)."""
    IdempotencyKey.objects.filter(pk=claim_id).update(status_code=status_code, response=response)


def idempotency_release(*, claim_id: int) -> None:
    """Drop a claim whose request failed unexpectedly (nothing to replay): a retry runs."""
    IdempotencyKey.objects.filter(pk=claim_id, status_code__isnull=True).delete()


def idempotency_purge(*, now: dt.datetime | None = None, batch: int = 5000) -> int:
    """Delete claims older than IDEMPOTENCY_TTL, in batches (the beat job). Returns the count."""
    cutoff = (now or timezone.now()) - IDEMPOTENCY_TTL
    total = 0
    while True:
        pks = list(
            IdempotencyKey.objects.filter(created_at__lt=cutoff).values_list("pk", flat=True)[
                :batch
            ]
        )
        if not pks:
            return total
        total += IdempotencyKey.objects.filter(pk__in=pks).delete()[0]
