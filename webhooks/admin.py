"""Operator views of webhook delivery: deliveries with their attempt timeline, replay,
endpoints (pause/resume), push configs with their binding versions, and alerts."""

from django.contrib import admin

from webhooks import services
from webhooks.delivery import delivery_replay
from webhooks.models import (
    Alert,
    Delivery,
    DeliveryAttempt,
    Endpoint,
    OperatorAction,
    PushBinding,
    PushConfig,
)


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_readonly_fields(self, request, obj=None):
        return self.fields


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class AttemptInline(ReadOnlyInline):
    model = DeliveryAttempt
    fields = (
        "number",
        "started_at",
        "duration_ms",
        "status",
        "error_class",
        "manual",
        "request_headers",
        "response_excerpt",
    )
    verbose_name_plural = "attempt timeline"


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "event_id",
        "task",
        "seq",
        "kind",
        "state",
        "attempts",
        "next_attempt_at",
        "last_status",
        "endpoint",
        "binding_version",
    )
    list_filter = ("state", "kind", "task__agent", "binding__endpoint")
    search_fields = ("=event_id", "=task__id")
    list_select_related = ("task", "binding", "binding__endpoint", "binding__config")
    exclude = ("body",)
    readonly_fields = ("body_preview",)
    inlines = [AttemptInline]
    actions = ["replay"]

    @admin.display(description="endpoint")
    def endpoint(self, obj):
        return obj.binding.endpoint.origin

    @admin.display(description="binding")
    def binding_version(self, obj):
        return f"{obj.binding.config.config_id} v{obj.binding.version}"

    @admin.display(description="body")
    def body_preview(self, obj):
        return obj.body[:5000]

    @admin.action(description="Replay selected (dead-lettered or delivered) deliveries")
    def replay(self, request, queryset):
        if not request.user.has_perm("webhooks.change_delivery"):
            self.message_user(request, "you may not replay deliveries", level="error")
            return
        count = delivery_replay(
            delivery_pks=list(queryset.values_list("pk", flat=True)),
            actor=request.user.get_username(),
        )
        self.message_user(request, f"{count} deliveries re-opened (same event ids)")


@admin.register(Endpoint)
class EndpointAdmin(ReadOnlyAdmin):
    list_display = (
        "origin",
        "consecutive_failures",
        "paused_at",
        "paused_reason",
        "last_success_at",
        "last_failure_at",
    )
    list_filter = ("paused_at",)
    search_fields = ("origin",)
    actions = ["pause", "resume"]

    @admin.action(description="Pause (hold deliveries)", permissions=["view"])
    def pause(self, request, queryset):
        for endpoint in queryset:
            services.endpoint_pause(endpoint_pk=endpoint.pk, actor=request.user.get_username())
        self.message_user(request, f"paused {queryset.count()} endpoint(s)")

    @admin.action(description="Resume (deliver what is held)", permissions=["view"])
    def resume(self, request, queryset):
        for endpoint in queryset:
            services.endpoint_resume(endpoint_pk=endpoint.pk, actor=request.user.get_username())
        self.message_user(request, f"resumed {queryset.count()} endpoint(s)")


class BindingInline(ReadOnlyInline):
    model = PushBinding
    fields = ("version", "url", "auth_scheme", "endpoint", "created_at", "retired_at")


@admin.register(PushConfig)
class PushConfigAdmin(ReadOnlyAdmin):
    list_display = ("config_id", "task", "current_version", "created_at", "deleted_at")
    search_fields = ("config_id", "=task__id")
    list_select_related = ("task",)
    inlines = [BindingInline]


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ("kind", "message", "endpoint", "count", "last_seen_at", "resolved_at")
    list_filter = ("kind", "resolved_at")
    actions = ["resolve"]

    @admin.action(description="Mark resolved", permissions=["view"])
    def resolve(self, request, queryset):
        for alert in queryset:
            services.alert_resolve(alert_pk=alert.pk, actor=request.user.get_username())
        self.message_user(request, "resolved")


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "target")
    list_filter = ("action",)
