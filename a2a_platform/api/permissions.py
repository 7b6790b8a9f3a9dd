"""Permission checks: a Django permission per operation, held by the user and (for a token)
inside its scope (a2a_platform/api/scopes.py). Staff only, as in the admin."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from a2a_platform.api.auth import request_token
from a2a_platform.api.errors import ApiError
from a2a_platform.api.scopes import SCOPE_PERMISSIONS, scope_allows


def has_scoped_perm(request, perm: str) -> bool:
    """The caller may use `perm`: an active staff user holding it, and a token's scope
    allowing it (a token never exceeds its user, nor its scope)."""
    return missing(request, perm) is None


def missing(request, perm: str) -> str | None:
    """Why the caller may not use `perm`, in words that say what to ask for; None if it may."""
    user = request.user
    if user is None or not user.is_authenticated or not user.is_active or not user.is_staff:
        return "the management API is for active staff users"
    if not user.has_perm(perm):
        return f"this operation needs the permission {perm}, which user {user} does not hold"
    token = request_token(request)
    if token is None or scope_allows(token.scope, perm):
        return None
    scopes = sorted(scope for scope, perms in SCOPE_PERMISSIONS.items() if perm in perms)
    granted = f"a token of scope {' or '.join(scopes)}" if scopes else "a session, not a token"
    return (
        f"this operation needs the permission {perm}, which this token's scope "
        f"{token.scope} does not grant; use {granted}"
    )


class PermissionMissing(ApiError):
    status_code = 403
    code = "permission_denied"


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
        if perm is None:
            return False
        if not (request.user and request.user.is_authenticated):
            return False  # DRF's 401 (not_authenticated), with the scheme to use
        why = missing(request, perm)
        if why is not None:
            raise PermissionMissing(why, permission=perm)
        return True


def perm_for(view, request) -> str | None:
    perms = getattr(view, "perms", None) or {}
    if request.method in perms:
        return perms[request.method]
    if request.method in SAFE_METHODS:
        return getattr(view, "read_perm", None)
    return getattr(view, "write_perm", None)
