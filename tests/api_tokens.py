"""Management API callers for tests: a staff user with given permissions, and a Bearer
token of a scope acting as them (made by the service operators use)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from a2a_platform.api.services import api_token_create

# Every permission an operator may hold through the API (the agents app's, the webhooks
# app's operator ones, rebinds, reading tokens): with a `rebind` token, the scope decides.
OPERATOR_PERMS = (
    "view_agent",
    "add_agent",
    "change_agent",
    "view_apikey",
    "add_apikey",
    "change_apikey",
    "view_signingkey",
    "view_task",
    "view_delivery",
    "change_delivery",
    "view_endpoint",
    "change_endpoint",
    "view_pushconfig",
    "view_alert",
    "change_alert",
    "view_rebind",
    "change_rebind",
    "run_rebind",
    "view_apitoken",
)


def user_with(name: str, *perms: str, staff: bool = True, superuser: bool = False):
    """A user holding the permissions named by codename (`view_delivery`) or in full
    (`webhooks.view_delivery`)."""
    model = get_user_model()
    user = (
        model.objects.create_superuser(name, password=None)
        if superuser
        else model.objects.create_user(name, is_staff=staff)
    )
    for perm in perms:
        app, _, codename = perm.rpartition(".")
        found = Permission.objects.filter(codename=codename)
        if app:
            found = found.filter(content_type__app_label=app)
        user.user_permissions.add(*found)
    return user


def token_for(user, scope: str = "rebind", name: str = "tests") -> str:
    """A live token's secret (the `Authorization: Bearer` value)."""
    return api_token_create(name=name, scope=scope, user=user, created_by=None).secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def api_client(name: str, *perms: str, scope: str = "rebind", staff: bool = True) -> APIClient:
    """An in-process DRF client with a token of `scope` for a new user holding `perms`."""
    client = APIClient()
    secret = token_for(user_with(name, *perms, staff=staff), scope)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client
