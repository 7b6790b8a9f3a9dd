"""Token scopes: each is the operator group of the same rank plus the management objects,
nested read < operate < rebind, and every permission they name exists (a typo would silently
grant nothing)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

from a2a_platform.api.scopes import SCOPE_PERMISSIONS

pytestmark = pytest.mark.django_db


def _group(name: str) -> set[str]:
    return {
        f"{app}.{codename}"
        for app, codename in Group.objects.get(name=name).permissions.values_list(
            "content_type__app_label", "codename"
        )
    }


def test_scopes_hold_their_groups_permissions_and_nest():
    read, operate, rebind = (SCOPE_PERMISSIONS[s] for s in ("read", "operate", "rebind"))
    assert _group("viewer") <= read
    assert _group("operator") <= operate
    assert _group("rebind operator") <= rebind
    assert read < operate < rebind
    assert "webhooks.run_rebind" in rebind - operate
    assert not any(p.startswith("platform_api.") and "view" not in p for p in rebind)
    assert not any(p.endswith(("delete_agent", "delete_apikey")) for p in rebind)


def test_every_scope_permission_exists():
    known = {
        f"{app}.{codename}"
        for app, codename in Permission.objects.values_list("content_type__app_label", "codename")
    }
    for scope, perms in SCOPE_PERMISSIONS.items():
        assert perms <= known, (scope, perms - known)
