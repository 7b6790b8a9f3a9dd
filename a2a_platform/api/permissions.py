"""Permission checks: a Django permission per operation, held by the user and (for a token)
inside its scope (a2a_platform/api/scopes.py). Staff only, as in the admin."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from a2a_platform.api.auth import request_token
from a2a_platform.api.scopes import scope_allows


def has_scoped_perm(request, perm: str) -> bool:
    """The caller may use `perm`: an active staff user holding it, and a token's scope
    allowing it (a token never exceeds its user, nor its scope)."""
    user = request.user
    if user is None or not user.is_authenticated or not user.is_active or not user.is_staff:
        return False
    if not user.has_perm(perm):
        return False
    token = request_token(request)
    return token is None or scope_allows(token.scope, perm)


class ScopedPermission(BasePermission):
    """The view names its permission: `read_perm` for safe methods, `write_perm` otherwise,
    or `perms = {"POST": ..., ...}` per method (which wins)."""

    message = "this token or user lacks the permission this operation needs"

    def has_permission(self, request, view) -> bool:
        if request.method.lower() not in view.http_method_names or not hasattr(
            view, request.method.lower()
        ):
            # A method the resource lacks is a 405 for any signed-in caller, not a 403.
            return bool(request.user and request.user.is_authenticated)
        perm = view.required_perm(request)
        return perm is not None and has_scoped_perm(request, perm)


def perm_for(view, request) -> str | None:
    perms = getattr(view, "perms", None) or {}
    if request.method in perms:
        return perms[request.method]
    if request.method in SAFE_METHODS:
        return getattr(view, "read_perm", None)
    return getattr(view, "write_perm", None)
