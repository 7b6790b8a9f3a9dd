import copy

from django import forms
from django.contrib import admin
from django.forms.models import construct_instance
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from a2a_platform.lib.admin import ReadOnlyAdmin, ReadOnlyInline, SecretLookupsRefused
from a2a_platform.lib.times import ConsoleTimes, when
from agents import executor_spec, readiness
from agents.card_signing import pretty
from agents.models import (
    Agent,
    ApiKey,
    CardVersion,
    Executor,
    SigningKey,
    SigningKeyState,
    WorkerHeartbeat,
)
from agents.services import EDITABLE_FIELDS, AgentError, agent_check, agent_save, api_key_revoke


class ApiKeyInline(ReadOnlyInline):
    model = ApiKey
    fields = ("name", "kind", "prefix", "created_at", "last_used_at", "revoked_at")
    show_change_link = True


class SigningKeyInline(ReadOnlyInline):
    """The agent's signing keys, public parts only (kid, algorithm, state, times; the
    private key is no field here). A retiring key links to its retirement (the console's
    confirmation, refused while an open rebind uses it); rotating is a rebind."""

    model = SigningKey
    fields = ("kid", "algorithm", "state", "created_at", "retiring_since", "retired_at", "manage")
    ordering = ("-created_at", "-id")
    verbose_name_plural = "signing keys (public parts)"

    @admin.display(description="")
    def manage(self, obj: SigningKey):
        if obj.state != SigningKeyState.RETIRING:
            return "-"
        url = reverse("admin:webhooks_rebind_retire_key", args=[obj.pk])
        return format_html('<a href="{}" class="a2a-retire-key">retire…</a>', url)


class CardVersionInline(ReadOnlyInline):
    model = CardVersion
    fields = ("content_hash", "first_served_at", "last_served_at")
    ordering = ("-last_served_at",)
    show_change_link = True
    verbose_name_plural = "card versions (every distinct card served)"


class ExecutorInput(forms.TextInput):
    """A text input suggesting the built-ins (a datalist): the value may also name hosted code,
    `python:<module>:<attribute>`, which no list can hold."""

    DATALIST_ID = "executor-suggestions"

    def __init__(self, attrs=None):
        super().__init__({"list": self.DATALIST_ID, "size": 60, **(attrs or {})})

    def render(self, name, value, attrs=None, renderer=None):
        options = format_html_join(
            "", '<option value="{}">{}</option>', ((v, label) for v, label in Executor.choices)
        )
        datalist = format_html('<datalist id="{}">{}</datalist>', self.DATALIST_ID, options)
        return format_html("{}{}", super().render(name, value, attrs, renderer), datalist)


class AgentForm(forms.ModelForm):
    """The agent's rules (agents.services.agent_check: slug, drain deadline, a card that
    renders) are checked here, so a refused edit comes back on the form by field and
    nothing is saved; save_model only saves."""

    class Meta:
        model = Agent
        # The admin passes its own field list; these are what an operator may set.
        fields = ["slug", *sorted(EDITABLE_FIELDS)]
        widgets = {"executor": ExecutorInput}

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
class AgentAdmin(ConsoleTimes, SecretLookupsRefused, admin.ModelAdmin):
    list_display = ("slug", "name", "executor", "auth_mode", "is_default", "enabled", "updated_at")
    list_filter = ("executor", "auth_mode", "enabled", "is_default")
    search_fields = ("slug", "name")
    inlines = [SigningKeyInline, ApiKeyInline, CardVersionInline]
    form = AgentForm
    readonly_fields = ("key_rotation", "readiness_checks", "capabilities_now", "card_as_served")
    # By purpose, not by name (every field AgentForm edits is in one: a test holds it).
    fieldsets = (
        ("Identity", {"fields": ("slug", "name", "description", "version", "executor")}),
        (
            "Switches",
            {
                "fields": (
                    "enabled",
                    "is_default",
                    "push_notifications_enabled",
                    "streaming_enabled",
                    "anonymous_list_tasks",
                    "strict_version_header",
                )
            },
        ),
        ("Authentication", {"fields": ("auth_mode",)}),
        (
            "Card",
            {
                "fields": (
                    "provider_organization",
                    "provider_url",
                    "documentation_url",
                    "skills",
                    "default_input_modes",
                    "default_output_modes",
                    "extensions",
                    "card_max_age",
                    "card_as_served",
                )
            },
        ),
        (
            "Push channels and rebinds",
            {
                "fields": (
                    "push_rebind_policy",
                    "push_rebind_deadline",
                    "push_rebind_on_timeout",
                    "push_rebind_min_overlap",
                    "key_rotation",
                )
            },
        ),
        ("Now", {"fields": ("readiness_checks", "capabilities_now")}),
    )

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
        rows = [
            (c.name.replace("_", " "), "ok" if c.ok else "FAILING", c.detail) for c in state.checks
        ]
        if obj.pk is not None and obj.executor.startswith(executor_spec.HOSTED_PREFIX):
            why = state.agent_not_ready(obj)
            load = state.hosted.get(obj.executor)
            detail = why or (load.detail if load else "")
            rows.append(("hosted executor", "ok" if why is None else "FAILING", detail))
        return render_to_string("admin/agents/agent/rows.html", {"rows": rows})

    @admin.display(description="capabilities now, and why one is off")
    def capabilities_now(self, obj):
        if obj.pk is None:
            return "-"
        caps = readiness.capabilities(obj, readiness.current())
        rows = [(name, "on" if cap.on else "off", cap.reason) for name, cap in caps.items()]
        return render_to_string("admin/agents/agent/rows.html", {"rows": rows})

    @admin.display(description="card as last served")
    def card_as_served(self, obj):
        version = obj.card_versions.order_by("-last_served_at", "-id").first() if obj.pk else None
        if version is None:
            return "not served yet"
        context = {
            "etag": version.content_hash[:32],
            "served": when(version.last_served_at),
            "card": pretty(version.card),
        }
        return render_to_string("admin/agents/agent/card_as_served.html", context)

    def save_model(self, request, obj, form, change):
        agent_save(agent=obj, actor=request.user.get_username())  # validated by AgentForm.clean


@admin.register(CardVersion)
class CardVersionAdmin(ReadOnlyAdmin):
    list_display = ("agent", "content_hash", "first_served_at", "last_served_at")
    list_filter = ("agent",)
    readonly_fields = ("agent", "content_hash", "first_served_at", "last_served_at", "card_json")
    exclude = ("card",)

    @admin.display(description="card")
    def card_json(self, obj):
        return format_html("<pre>{}</pre>", pretty(obj.card))


@admin.register(ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    """Keys are created with `manage.py create_api_key` (the token is printed once) and
    revoked by the action (the model's change permission)."""

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

    def has_delete_permission(self, request, obj=None):
        # Unlike the other read-only pages, a key row may still be deleted (Django's delete
        # permission), as it could before this page shared the read-only base.
        return admin.ModelAdmin.has_delete_permission(self, request, obj)

    @admin.action(description="Revoke selected keys", permissions=["operate"])
    def revoke(self, request, queryset):
        count = 0
        for key in queryset.filter(revoked_at__isnull=True):
            api_key_revoke(key_id=key.pk, actor=request.user.get_username())
            count += 1
        self.message_user(request, f"revoked {count} key(s)")


@admin.register(SigningKey)
class SigningKeyAdmin(ReadOnlyAdmin):
    """Read-only: keys are created and rotated through agents.signing. The private key is
    never shown (not listed, not a field, not searchable)."""

    list_display = ("kid", "agent", "state", "created_at", "retiring_since", "retired_at")
    list_filter = ("state", "agent")
    search_fields = ("kid",)
    list_select_related = ("agent",)
    fields = ("kid", "agent", "state", "created_at", "retiring_since", "retired_at")
    readonly_fields = fields


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    """The workers page (the dashboard's worker rows link here): each Celery worker that ever
    proved itself, with the queues it consumes, its last heartbeat and whether that is fresh
    (the readiness gate's own test, `readiness.worker_liveness`), and the hosted executors it
    can or cannot load. Rows are written by the workers' heartbeats only."""

    list_display = ("hostname", "queue_list", "live", "beat_at", "started_at", "hosted_load")
    search_fields = ("hostname",)
    ordering = ("hostname",)
    fields = (
        "hostname",
        "queue_list",
        "live",
        "beat_at",
        "started_at",
        "backlog_reenqueued_at",
        "hosted_load",
    )
    readonly_fields = fields

    @admin.display(description="queues")
    def queue_list(self, obj):
        return ", ".join(obj.queues) or "none"

    @admin.display(description="heartbeat")
    def live(self, obj):
        return "live" if readiness.heartbeat_fresh(obj) else "stale"

    @admin.display(description="hosted executors")
    def hosted_load(self, obj):
        if not obj.hosted:
            return "none"
        return format_html_join(
            "",
            "<div><code>{}</code>: {}</div>",
            ((spec, "loads" if why is None else why) for spec, why in sorted(obj.hosted.items())),
        )
