from django.contrib import admin, messages

from agents.models import Agent, ApiKey, SigningKey
from agents.services import AgentError, agent_save, api_key_revoke


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    can_delete = False
    fields = ("name", "kind", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "executor", "auth_mode", "is_default", "enabled", "updated_at")
    list_filter = ("executor", "auth_mode", "enabled", "is_default")
    search_fields = ("slug", "name")
    inlines = [ApiKeyInline]

    def save_model(self, request, obj, form, change):
        try:
            agent_save(agent=obj)
        except AgentError as exc:
            messages.error(request, str(exc))


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are created with `manage.py create_api_key` (the token is printed once)."""

    list_display = ("name", "agent", "kind", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("kind", "agent")
    search_fields = ("name", "prefix")
    list_select_related = ("agent",)
    readonly_fields = (
        "agent",
        "kind",
        "name",
        "prefix",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    exclude = ("digest",)
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request, queryset):
        count = 0
        for key in queryset.filter(revoked_at__isnull=True):
            api_key_revoke(key_id=key.pk)
            count += 1
        self.message_user(request, f"revoked {count} key(s)")


@admin.register(SigningKey)
class SigningKeyAdmin(admin.ModelAdmin):
    """Read-only: keys are created and rotated through agents.signing. The private key is
    never shown (not listed, not a field, not searchable)."""

    list_display = ("kid", "agent", "state", "created_at", "retiring_since", "retired_at")
    list_filter = ("state", "agent")
    search_fields = ("kid",)
    list_select_related = ("agent",)
    fields = ("kid", "agent", "state", "created_at", "retiring_since", "retired_at")
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
