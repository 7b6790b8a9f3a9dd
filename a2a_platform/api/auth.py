"""Who is calling: `Authorization: Bearer <token>` (an integrator's ApiToken), or the admin's
session for the browsable API (DRF's SessionAuthentication: CSRF enforced on writes)."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from a2a_platform.api.models import ApiToken
from a2a_platform.api.services import api_token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """`request.user` is the token's user, `request.auth` the ApiToken. No Authorization
    header: not this scheme (the session may answer); a bad, revoked or expired one: 401."""

    keyword = "bearer"

    def authenticate(self, request):
        header = request.headers.get("Authorization", "")
        if not header:
            return None
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != self.keyword:
            raise exceptions.AuthenticationFailed("use Authorization: Bearer <token>")
        token = api_token_authenticate(secret.strip())
        if token is None:
            raise exceptions.AuthenticationFailed("invalid, revoked or expired token")
        return token.user, token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="a2a-platform"'


def request_token(request) -> ApiToken | None:
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiToken) else None


def principal(request) -> str:
    """Who owns an Idempotency-Key: the token, else the session's user."""
    token = request_token(request)
    return f"token:{token.pk}" if token is not None else f"user:{request.user.pk}"


def actor(request) -> str:
    """The audit rows' actor: `api:<username>`."""
    return f"api:{request.user.get_username()}"
