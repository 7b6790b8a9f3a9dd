import copy

from django import forms
from django.contrib import admin
from django.forms.models import construct_instance
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from agents import readiness
from agents.card_signing import pretty
from agents.models import Agent, ApiKey, CardVersion, SigningKey, SigningKeyState
from agents.services import EDITABLE_FIELDS, AgentError, agent_check, agent_save, api_key_revoke

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


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    can_delete = False
    fields = ("name", "kind", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


class SigningKeyInline(admin.TabularInline):
    """The agent's signing keys, public parts only (kid, algorithm, state, times; the
    private key is no field here). A retiring key links to its retirement (the console's
    confirmation, refused while an open rebind holds it); rotating is a rebind."""

    model = SigningKey
    extra = 0
    can_delete = False
    fields = ("kid", "algorithm", "state", "created_at", "retiring_since", "retired_at", "manage")
    readonly_fields = fields
    ordering = ("-created_at", "-id")
    verbose_name_plural = "signing keys (public parts)"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="")
    def manage(self, obj: SigningKey):
        if obj.state != SigningKeyState.RETIRING:
            return "-"
        url = reverse("admin:webhooks_rebind_retire_key", args=[obj.pk])
        return format_html('<a href="{}" class="a2a-retire-key">retire…</a>', url)


class CardVersionInline(admin.TabularInline):
    model = CardVersion
    extra = 0
    can_delete = False
    fields = ("content_hash", "first_served_at", "last_served_at")
    readonly_fields = fields
    ordering = ("-last_served_at",)
    show_change_link = True
    verbose_name_plural = "card versions (every distinct card served)"

    def has_add_permission(self, request, obj=None):
        return False


class AgentForm(forms.ModelForm):
    """The agent's rules (agents.services.agent_check: slug, drain deadline, a card that
    renders) are checked here, so a refused edit comes back on the form by field and
    nothing is saved; save_model only saves."""

    class Meta:
        model = Agent
        # The admin passes its own field list; these are what an operator may set.
        fields = ["slug", *sorted(EDITABLE_FIELDS)]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        candidate = construct_instance(self, copy.copy(self.instance))
        try:
            agent_check(candidate)
        except AgentError as exc:
            fields = {f: problems for f, problems in exc.fields.items() if f in self.fields}
            for field, problems in fields.items():
                for problem in problems:
                    self.add_error(field, problem)
            if not fields:
                self.add_error(None, str(exc))
        return data


@admin.register(Agent)
class AgentAdmin(SecretLookupsRefused, admin.ModelAdmin):
    list_display = ("slug", "name", "executor", "auth_mode", "is_default", "enabled", "updated_at")
    list_filter = ("executor", "auth_mode", "enabled", "is_default")
    search_fields = ("slug", "name")
    inlines = [SigningKeyInline, ApiKeyInline, CardVersionInline]
    form = AgentForm
    readonly_fields = ("key_rotation", "readiness_checks", "capabilities_now", "card_as_served")

    @admin.display(description="signing key rotation")
    def key_rotation(self, obj):
        if obj.pk is None:
            return "-"
        # A rotation is a rebind (drain or cutover, with its checks and blast radius):
        # the wizard, prefilled.
        url = reverse("admin:webhooks_rebind_start")
        return format_html(
            '<a href="{}?agent={}&amp;operations=rotate_key" id="rotate-key">'
            "Rotate the signing key (start a key-rotation rebind)</a>",
            url,
            obj.slug,
        )

    @admin.display(description="readiness (this instance)")
    def readiness_checks(self, obj):
        state = readiness.current()
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((c.name, "ok" if c.ok else "FAILING", c.detail) for c in state.checks),
        )
        return format_html("<table>{}</table>", rows)

    @admin.display(description="capabilities now, and why one is off")
    def capabilities_now(self, obj):
        if obj.pk is None:
            return "-"
        caps = readiness.capabilities(obj, readiness.current())
        lines = [(name, "on" if cap.on else "off", cap.reason) for name, cap in caps.items()]
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", lines)
        return format_html("<table>{}</table>", rows)

    @admin.display(description="card as last served")
    def card_as_served(self, obj):
        version = obj.card_versions.order_by("-last_served_at", "-id").first() if obj.pk else None
        if version is None:
            return "not served yet"
        return format_html(
            "<p>ETag {} · last served {}</p><pre>{}</pre>",
            version.content_hash[:32],
            version.last_served_at,
            pretty(version.card),
        )

    def save_model(self, request, obj, form, change):
        agent_save(agent=obj)  # validated by AgentForm.clean


@admin.register(CardVersion)
class CardVersionAdmin(SecretLookupsRefused, admin.ModelAdmin):
    list_display = ("agent", "content_hash", "first_served_at", "last_served_at")
    list_filter = ("agent",)
    readonly_fields = ("agent", "content_hash", "first_served_at", "last_served_at", "card_json")
    exclude = ("card",)

    @admin.display(description="card")
    def card_json(self, obj):
        return format_html("<pre>{}</pre>", pretty(obj.card))

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(SecretLookupsRefused, admin.ModelAdmin):
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
class SigningKeyAdmin(SecretLookupsRefused, admin.ModelAdmin):
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
