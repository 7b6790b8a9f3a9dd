"""Token scopes as Django permissions: the operators' groups (webhooks/console/operator_groups.py)
plus the management objects only this API and the admin change (agents, their keys, tokens).

A token's effective permissions are its scope's set intersected with its user's: a scope
never lends a permission the user lacks."""

from __future__ import annotations

from a2a_platform.api.models import TokenScope
from webhooks.console.operator_groups import GROUPS

_READ_EXTRA = ["platform_api.view_apitoken"]
# Agents and their A2A keys are created and edited by operators in the admin; an `operate`
# token may do the same where its user may.
_OPERATE_EXTRA = [
    "agents.add_agent",
    "agents.change_agent",
    "agents.add_apikey",
    "agents.change_apikey",
]


def _perms(group: str) -> frozenset[str]:
    return frozenset(f"{app}.{codename}" for app, codename in GROUPS[group])


SCOPE_PERMISSIONS: dict[str, frozenset[str]] = {
    TokenScope.READ: _perms("viewer") | frozenset(_READ_EXTRA),
    TokenScope.OPERATE: _perms("operator") | frozenset(_READ_EXTRA + _OPERATE_EXTRA),
    TokenScope.REBIND: _perms("rebind operator") | frozenset(_READ_EXTRA + _OPERATE_EXTRA),
}


def scope_allows(scope: str, perm: str) -> bool:
    return perm in SCOPE_PERMISSIONS.get(scope, frozenset())
