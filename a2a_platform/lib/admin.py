"""The operator console's shared rules, for every app's admin: rows that change through
the services only are shown read-only (`ReadOnlyAdmin`, `ReadOnlyInline`), no page filters
by a stored secret (`SecretLookupsRefused`, the one guard every ModelAdmin mixes in), and
every time reads the same (`ConsoleTimes`, mixed into both read-only bases and the editable
admins: a2a_platform/lib/times.py).
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_permission_codename

from a2a_platform.lib.times import ConsoleTimes

# Every stored secret of the platform (digests of API keys and tokens, encrypted private
# keys, webhook tokens and credentials, a rebind's new ones). No admin page renders,
# searches or filters by them, through any relation.
SECRET_FIELDS = frozenset(
    {
        "digest",
        "private_key_encrypted",
        "token_encrypted",
        "credentials_encrypted",
        "new_token_encrypted",
        "new_credentials_encrypted",
    }
)


class SecretLookupsRefused:
    """A ModelAdmin mixin refusing URL lookups through a secret field, as Django's UserAdmin
    does for `password`: `?digest__startswith=ab` would let a viewer find a secret a prefix
    at a time by counting rows. Django then answers 400 (DisallowedModelAdminLookup)."""

    def lookup_allowed(self, lookup, value, request=None):
        if SECRET_FIELDS.intersection(lookup.split("__")):
            return False
        if "\x00" in str(value):  # PostgreSQL refuses NUL in a literal: a 400, not a 500
            return False
        return super().lookup_allowed(lookup, value, request)


class ReadOnlyInline(ConsoleTimes, admin.TabularInline):
    """Related rows shown on their parent's page, never added, changed or deleted there."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_readonly_fields(self, request, obj=None):
        # Every shown field is read-only; without this the inline's form is built with a
        # non-editable field (`created_at`) and the parent's page fails with a FieldError.
        return self._timed(self.fields)


class ReadOnlyAdmin(ConsoleTimes, SecretLookupsRefused, admin.ModelAdmin):
    """Rows change through the services only: no add, change or delete form for anyone.

    Operator actions that write are allowed by the model's change permission, checked by
    `has_operate_permission` (`@admin.action(permissions=["operate"])`): Django's own
    `permissions=["change"]` asks `has_change_permission`, which is False here for everyone,
    and `permissions=["view"]` would let a staff user who may only look pause, resume,
    resolve and replay."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_operate_permission(self, request) -> bool:
        codename = get_permission_codename("change", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")
