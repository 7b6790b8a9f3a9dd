"""Operator views of webhook delivery: deliveries with their attempt timeline, replay,
endpoints (pause/resume), push configs with their binding versions, alerts, and rebinds with
their moves (advance, cut over, abort; starting one is `manage.py rebind`, docs/rebinds.md)."""

import uuid

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from webhooks import rebind as rebinds
from webhooks import services
from webhooks.errors import RebindConflict, RebindInvalid, WebhookError
from webhooks.forms import RebindForm
from webhooks.models import (
    Alert,
    ChannelMove,
    Delivery,
    DeliveryAttempt,
    Endpoint,
    OperatorAction,
    PushBinding,
    PushConfig,
    Rebind,
)
from webhooks.rebind_checks import rebind_preview
from webhooks.rebind_machine import IllegalRebindTransition


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


class TaskFilter(admin.SimpleListFilter):
    """Deliveries of one task: reached from a row's task link (`?task=<id>`). The side bar
    offers only the chosen task: one link per task ever delivered would not fit."""

    title = "task"
    parameter_name = "task"

    def lookups(self, request, model_admin):
        # Any chosen value, a malformed one too: a filter without choices is not applied.
        return [(self.value(), self.value())] if self.value() else []

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        try:
            return queryset.filter(task_id=uuid.UUID(self.value()))
        except ValueError:
            return queryset.none()


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "event_id",
        "agent",
        "task_link",
        "seq",
        "kind",
        "state",
        "attempts",
        "next_attempt_at",
        "last_status",
        "endpoint",
        "binding_version",
    )
    list_filter = ("state", "kind", "task__agent", TaskFilter, "binding__endpoint")
    search_fields = ("=event_id", "=task__id")
    list_select_related = ("task__agent", "binding__endpoint", "binding__config")
    exclude = ("body",)
    readonly_fields = ("body_preview",)
    inlines = [AttemptInline]
    actions = ["replay"]

    @admin.display(description="agent", ordering="task__agent__slug")
    def agent(self, obj):
        return obj.task.agent.slug

    @admin.display(description="task", ordering="task_id")
    def task_link(self, obj):
        return format_html('<a href="?task={}">{}</a>', obj.task_id, obj.task_id)

    @admin.display(description="endpoint")
    def endpoint(self, obj):
        return obj.binding.endpoint.origin

    @admin.display(description="binding")
    def binding_version(self, obj):
        return f"{obj.binding.config.config_id} v{obj.binding.version}"

    @admin.display(description="body")
    def body_preview(self, obj):
        return obj.body[:5000]

    @admin.action(
        description="Replay selected (dead-lettered or delivered) deliveries",
        permissions=["operate"],
    )
    def replay(self, request, queryset):
        selected = list(queryset.values_list("pk", flat=True))
        count = services.delivery_replay(delivery_pks=selected, actor=request.user.get_username())
        self.message_user(
            request,
            f"{count} of {len(selected)} selected deliveries re-opened (same event ids); "
            "only dead-lettered or delivered ones of live configs are replayed",
        )


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

    @admin.action(description="Pause (hold deliveries)", permissions=["operate"])
    def pause(self, request, queryset):
        for endpoint in queryset:
            services.endpoint_pause(endpoint_pk=endpoint.pk, actor=request.user.get_username())
        self.message_user(request, f"paused {queryset.count()} endpoint(s)")

    @admin.action(description="Resume (deliver what is held)", permissions=["operate"])
    def resume(self, request, queryset):
        for endpoint in queryset:
            services.endpoint_resume(endpoint_pk=endpoint.pk, actor=request.user.get_username())
        self.message_user(request, f"resumed {queryset.count()} endpoint(s)")


class BindingInline(ReadOnlyInline):
    model = PushBinding
    fields = (
        "version",
        "url",
        "auth_scheme",
        "endpoint",
        "created_at",
        "activated_at",
        "retired_at",
    )


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

    @admin.action(description="Mark resolved", permissions=["operate"])
    def resolve(self, request, queryset):
        for alert in queryset:
            services.alert_resolve(alert_pk=alert.pk, actor=request.user.get_username())
        self.message_user(request, "resolved")


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "target")
    list_filter = ("action",)


# A service refusal's field, as the wizard's form names it (None: the form as a whole).
_FORM_FIELD = {
    "move_from": "move_from",
    "move_to": "move_to",
    "move_prefix": "move_from",
    "deadline": "deadline",
    "at": "at",
    "policy": "policy",
    "on_timeout": "on_timeout",
    "finish_on_old": "finish_on_old",
    "new_url": "new_url",
    "config": "config_id",
}


class MoveInline(ReadOnlyInline):
    model = ChannelMove
    fields = ("task", "config", "state", "old_binding", "new_binding", "notice", "from_seq")
    raw_id_fields = ("task", "config", "old_binding", "new_binding", "notice")
    show_change_link = False
    max_num = 0


@admin.register(Rebind)
class RebindAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "agent",
        "state",
        "policy",
        "scope",
        "on_old",
        "moved",
        "orphaned",
        "deadline",
        "actor",
        "created_at",
    )
    list_filter = ("state", "policy", "agent")
    list_select_related = ("agent",)
    readonly_fields = [f.name for f in Rebind._meta.fields]
    exclude = ("new_token_encrypted", "new_credentials_encrypted")
    inlines = [MoveInline]
    actions = ["advance", "cut_over", "abort"]
    change_list_template = "admin/webhooks/rebind/change_list.html"

    def has_run_rebind_permission(self, request) -> bool:
        return request.user.has_perm("webhooks.run_rebind")

    def get_urls(self):
        wizard = self.admin_site.admin_view(self.wizard_view)
        return [path("start/", wizard, name="webhooks_rebind_start"), *super().get_urls()]

    def changelist_view(self, request, extra_context=None):
        extra = {"can_run_rebind": self.has_run_rebind_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def wizard_view(self, request):
        """Start a rebind in two steps: the form, then a confirmation page with every check's
        result and the blast radius (tasks on the old version by state, configs, endpoints,
        the list); nothing is written until it is confirmed."""
        if not self.has_run_rebind_permission(request):
            raise PermissionDenied
        form = RebindForm(request.POST or None)
        context = {**self.admin_site.each_context(request), "opts": self.opts, "form": form}
        context["title"] = "Start a rebind"
        if request.method == "POST" and form.is_valid():
            rebind_request = form.rebind_request()
            try:
                preview = rebind_preview(rebind_request)
                if request.POST.get("confirm") == "yes" and (
                    preview.conflict is None or rebind_request.force
                ):
                    rebind = rebinds.rebind_start(rebind_request, actor=request.user.get_username())
                    self.message_user(request, f"rebind {rebind.pk}: {rebind.state}")
                    return HttpResponseRedirect(
                        reverse("admin:webhooks_rebind_change", args=[rebind.pk])
                    )
            except RebindInvalid as exc:
                form.add_error(_FORM_FIELD.get(exc.field), f"{exc.field}: {exc.description}")
            except RebindConflict as exc:
                form.add_error("force", str(exc))
            else:
                context.update(preview=preview, title="Confirm the rebind")
                return TemplateResponse(request, "admin/webhooks/rebind/confirm.html", context)
        return TemplateResponse(request, "admin/webhooks/rebind/start.html", context)

    @admin.display(description="scope")
    def scope(self, obj: Rebind) -> str:
        parts = ["rotate key"] if obj.rotate_key else []
        if obj.move_from:
            parts.append(f"{obj.move_from} → {obj.move_to}")
        if obj.config_id:
            parts.append(f"config {obj.config_id}")
        return ", ".join(parts)

    @admin.display(description="on old version")
    def on_old(self, obj: Rebind) -> str:
        count = (obj.counts or {}).get("onOldVersionTotal", 0)
        url = reverse("admin:webhooks_channelmove_changelist")
        return format_html(
            '<a href="{}?rebind__id__exact={}&state__in=notice_pending,finishing_on_old">{}</a>',
            url,
            obj.pk,
            count,
        )

    @admin.display(description="moved")
    def moved(self, obj: Rebind) -> int:
        return (obj.counts or {}).get("moved", 0)

    @admin.display(description="orphaned")
    def orphaned(self, obj: Rebind) -> int:
        return (obj.counts or {}).get("orphaned", 0)

    def _each(self, request, queryset, step, done: str) -> None:
        for rebind in queryset:
            try:
                step(rebind)
            except (WebhookError, IllegalRebindTransition) as exc:
                self.message_user(request, f"rebind {rebind.pk}: {exc}", level="error")
            else:
                self.message_user(request, f"rebind {rebind.pk}: {done}")

    @admin.action(description="Advance now (what the monitor does)", permissions=["operate"])
    def advance(self, request, queryset):
        self._each(request, queryset, lambda r: rebinds.rebind_advance(r.pk), "advanced")

    @admin.action(description="Cut over (orphan what is left)", permissions=["run_rebind"])
    def cut_over(self, request, queryset):
        actor = request.user.get_username()
        self._each(
            request, queryset, lambda r: rebinds.rebind_cutover(r.pk, actor=actor), "cut over"
        )

    @admin.action(description="Abort", permissions=["run_rebind"])
    def abort(self, request, queryset):
        actor = request.user.get_username()
        self._each(request, queryset, lambda r: rebinds.rebind_abort(r.pk, actor=actor), "aborted")


@admin.register(ChannelMove)
class ChannelMoveAdmin(ReadOnlyAdmin):
    """A rebind's moves, one per config: filter by rebind and state for the tasks still on
    the old version, and decide for the selected ones (the rebind services)."""

    list_display = ("task", "task_state", "config", "state", "notice_state", "created_at")
    list_filter = ("state", "rebind")
    list_select_related = ("task", "config", "notice")
    search_fields = ("=task__id", "config__config_id")
    actions = ["move_now", "finish_on_old"]

    @admin.display(description="task state")
    def task_state(self, obj: ChannelMove) -> str:
        return obj.task.task_state.short

    @admin.display(description="notice")
    def notice_state(self, obj: ChannelMove) -> str:
        if obj.notice is None:
            return "-"
        return obj.notice.state + (f" ({obj.notice.last_error})" if obj.notice.last_error else "")

    def has_run_rebind_permission(self, request) -> bool:
        return request.user.has_perm("webhooks.run_rebind")

    def _by_rebind(self, request, queryset, step, done: str) -> None:
        actor = request.user.get_username()
        by_rebind: dict = {}
        for move in queryset:
            by_rebind.setdefault(move.rebind_id, []).append(move.pk)
        for rebind_pk, move_pks in by_rebind.items():
            try:
                count = step(rebind_pk, move_pks=move_pks, actor=actor)
            except (WebhookError, IllegalRebindTransition) as exc:
                self.message_user(request, f"rebind {rebind_pk}: {exc}", level="error")
            else:
                self.message_user(request, f"rebind {rebind_pk}: {count} {done}")

    @admin.action(
        description="Move now (without waiting for the notice)", permissions=["run_rebind"]
    )
    def move_now(self, request, queryset):
        self._by_rebind(request, queryset, rebinds.rebind_moves_now, "moved")

    @admin.action(description="Let finish on the old channel", permissions=["run_rebind"])
    def finish_on_old(self, request, queryset):
        self._by_rebind(request, queryset, rebinds.rebind_moves_finish_on_old, "left on old")
