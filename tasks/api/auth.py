"""Worker-token authentication: `Authorization: Bearer <token>` of a `worker` API key."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from agents.models import ApiKeyKind
from agents.services import api_key_authenticate


class WorkerPrincipal:
    is_authenticated = True

    def __init__(self, key) -> None:
        self.key = key
        self.agent = key.agent
        self.claimant = f"api:{key.prefix}"


class WorkerTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise exceptions.NotAuthenticated("a worker token is required (Authorization: Bearer)")
        key = api_key_authenticate(token.strip(), kind=ApiKeyKind.WORKER)
        if key is None or not key.agent.enabled:
            raise exceptions.AuthenticationFailed("invalid or revoked worker token")
        return WorkerPrincipal(key), key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="a2a-worker"'
