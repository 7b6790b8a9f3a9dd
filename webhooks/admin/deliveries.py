"""Deliveries: newest first with their attempt timeline (each try's place in its run, its
failure in words), filtered by task or a paused endpoint; replay and retry now."""

import uuid

from django.contrib import admin, messages
from django.db.models import OuterRef, Q, Subquery
from django.urls import reverse
from django.utils.html import format_html

from a2a_platform.lib.admin import ReadOnlyAdmin, ReadOnlyInline
from a2a_platform.lib.times import when, when_text
from webhooks.admin.display import pretty, skipped_text
from webhooks.console import delivery_actions
from webhooks.console.endpoint_probe import url_shown
from webhooks.delivery import retry_policy
from webhooks.delivery.claim_record import retry_schedule
from webhooks.models import (
    OPEN_DELIVERY_STATES,
    ChannelMove,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
)


def tries_per_run() -> int:
    """The denominator of "attempt n of m": the retry policy's tries on the outage schedule
    (A2A_WEBHOOK_RETRY_SCHEDULE); a run restarts at a replay. 401/403 answers are retried on
    the shorter auth schedule, which does not use these up (webhooks/delivery/retry_policy.py).
    """
    return retry_policy.max_tries(retry_schedule())


class AttemptInline(ReadOnlyInline):
    """A delivery's attempts, newest first, each with its failure in words."""

    model = DeliveryAttempt
    fields = (
        "attempt_of",
        "started",
        "duration_ms",
        "result",
        "failure",
        "url_shown",
        "headers_shown",
        "response_shown",
    )
    verbose_name_plural = "attempt timeline"

    def get_queryset(self, request):
        # A manual attempt opens a replay's run: an attempt's place in its run counts from
        # the latest manual attempt at or before it.
        run_start = DeliveryAttempt.objects.filter(
            delivery=OuterRef("delivery"), manual=True, number__lte=OuterRef("number")
        ).order_by("-number")
        return (
            super()
            .get_queryset(request)
            .annotate(run_start=Subquery(run_start.values("number")[:1]))
            .order_by("-number")
        )

    @admin.display(description="attempt")
    def attempt_of(self, obj: DeliveryAttempt) -> str:
        place = obj.number - (obj.run_start or 1) + 1
        replay = " (replay)" if obj.run_start else ""
        return f"{place} of {tries_per_run()}{replay}"

    @admin.display(description="started")
    def started(self, obj: DeliveryAttempt) -> str:
        return when(obj.started_at)

    @admin.display(description="status or error")
    def result(self, obj: DeliveryAttempt) -> str:
        """The receiver's status, or the transport's error class when it did not answer."""
        if obj.status is not None:
            return str(obj.status)
        return obj.error_class or ("sending" if obj.duration_ms is None else "-")

    @admin.display(description="failure")
    def failure(self, obj: DeliveryAttempt) -> str:
        return obj.error_detail or "-"

    @admin.display(description="URL")
    def url_shown(self, obj: DeliveryAttempt) -> str:
        return url_shown(obj.url)

    @admin.display(description="request headers")
    def headers_shown(self, obj: DeliveryAttempt) -> str:
        return pretty(obj.request_headers)  # stored redacted (delivery/headers.py redact)

    @admin.display(description="response")
    def response_shown(self, obj: DeliveryAttempt) -> str:
        return pretty(obj.response_excerpt)


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


class PausedFilter(admin.SimpleListFilter):
    """Open deliveries waiting on a paused endpoint (nothing is tried)."""

    title = "endpoint paused"
    parameter_name = "paused"

    def lookups(self, request, model_admin):
        return [("yes", "waiting on a paused endpoint")]

    def queryset(self, request, queryset):
        if self.value() != "yes":
            return queryset
        return queryset.filter(
            state__in=OPEN_DELIVERY_STATES, binding__endpoint__paused_at__isnull=False
        )


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    """Deliveries newest first: when, what, where to, how it stands (a delivery waiting on a
    paused endpoint says so), its try out of the run's tries and the last failure in words."""

    list_display = (
        "event_id",
        "created",
        "task_link",
        "state_shown",
        "attempt_of",
        "next_try",
        "last_failure",
        "receiver",
    )
    list_filter = ("state", PausedFilter, "kind", "task__agent", TaskFilter, "binding__endpoint")
    search_fields = ("=event_id", "=task__id")
    list_select_related = ("task__agent", "binding__endpoint", "binding__config")
    ordering = ("-id",)
    fields = (
        "event_id",
        "task",
        "config",
        "channel_version",
        "endpoint_link",
        "rebind_link",
        "seq",
        "state_shown",
        "attempt_of",
        "created_exact",
        "next_try",
        "finished_exact",
        "last_status",
        "last_failure",
        "body_preview",
    )
    readonly_fields = fields
    inlines = [AttemptInline]
    actions = ["replay", "retry_now"]

    class Media:
        css = {"all": ["webhooks/console.css"]}

    def get_queryset(self, request):
        last = DeliveryAttempt.objects.filter(delivery=OuterRef("pk")).order_by("-number")
        return (
            super()
            .get_queryset(request)
            .annotate(
                last_detail=Subquery(last.values("error_detail")[:1]),
                last_class=Subquery(last.values("error_class")[:1]),
            )
        )

    def changelist_view(self, request, extra_context=None):
        # The admin's navigation column would take the width the triage columns need.
        extra = {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @admin.display(description="created", ordering="id")
    def created(self, obj):
        return when(obj.created_at)

    @admin.display(description="agent / task", ordering="task__agent__slug")
    def task_link(self, obj):
        # The task id's first block (the whole id in the title and in the filter link).
        return format_html(
            '{}<br><a href="?task={}" title="{}">{}…</a>',
            obj.task.agent.slug,
            obj.task_id,
            obj.task_id,
            str(obj.task_id)[:8],
        )

    @admin.display(description="state", ordering="state")
    def state_shown(self, obj):
        endpoint = obj.binding.endpoint
        if obj.state in OPEN_DELIVERY_STATES and endpoint.paused_at is not None:
            return format_html(
                '<span class="a2a-chip a2a-paused" title="{}">paused</span> {}'
                "<br><small>{}</small>",
                f"{endpoint.origin} paused at {when_text(endpoint.paused_at)}: "
                f"{endpoint.paused_reason}",
                obj.get_state_display(),
                obj.kind,
            )
        return format_html(
            '<span class="a2a-chip a2a-{}">{}</span><br><small>{}</small>',
            obj.state,
            obj.get_state_display(),
            obj.kind,
        )

    @admin.display(description="channel version")
    def channel_version(self, obj):
        """The config version it was sent on, linking to the config's page (its versions)."""
        binding = obj.binding
        url = reverse("admin:webhooks_pushconfig_change", args=[binding.config_id])
        return format_html(
            '<a href="{}">{}.v{}</a>', url, binding.config.config_id, binding.version
        )

    @admin.display(description="endpoint")
    def endpoint_link(self, obj):
        endpoint = obj.binding.endpoint
        url = reverse("admin:webhooks_endpoint_change", args=[endpoint.pk])
        return format_html('<a href="{}">{}</a>', url, endpoint.origin)

    @admin.display(description="rebind")
    def rebind_link(self, obj):
        """The rebind this delivery belongs to: the one whose notice it is, or whose new
        channel version it was sent on."""
        rebind_id = (
            ChannelMove.objects.filter(Q(notice=obj) | Q(new_binding=obj.binding_id))
            .order_by("-id")
            .values_list("rebind_id", flat=True)
            .first()
        )
        if rebind_id is None:
            return "-"
        url = reverse("admin:webhooks_rebind_change", args=[rebind_id])
        return format_html('<a href="{}">{}…</a>', url, str(rebind_id)[:8])

    @admin.display(description="attempt")
    def attempt_of(self, obj):
        return f"{obj.attempts} of {tries_per_run()}"

    @admin.display(description="created")
    def created_exact(self, obj):
        return when(obj.created_at)

    @admin.display(description="finished")
    def finished_exact(self, obj):
        return when(obj.finished_at)

    @admin.display(description="next try", ordering="next_attempt_at")
    def next_try(self, obj):
        if obj.state not in OPEN_DELIVERY_STATES:
            return "-"
        if obj.binding.endpoint.paused_at is not None:
            return "waiting (endpoint paused)"
        return when(obj.next_attempt_at)

    @admin.display(description="last failure")
    def last_failure(self, obj):
        if obj.state == DeliveryState.DELIVERED:
            return "-"
        return obj.last_detail or obj.last_class or obj.last_error or "-"

    @admin.display(description="receiver URL")
    def receiver(self, obj):
        binding = obj.binding
        return format_html(
            '<span class="a2a-url">{}</span><br><small>{}.v{}</small>',
            url_shown(binding.url),
            binding.config.config_id,
            binding.version,
        )

    @admin.display(description="body")
    def body_preview(self, obj):
        return pretty(obj.body[:20000])

    @admin.action(
        description="Replay selected (dead-lettered or delivered) deliveries",
        permissions=["operate"],
    )
    def replay(self, request, queryset):
        selected = list(queryset.values_list("event_id", flat=True))
        outcome = delivery_actions.delivery_replay_explained(
            event_ids=selected, actor=request.user.get_username()
        )
        self.message_user(
            request,
            f"{outcome.replayed} of {outcome.requested} selected deliveries re-opened "
            "(same event ids); only dead-lettered or delivered ones of live configs are "
            "replayed",
            level=messages.SUCCESS if outcome.replayed else messages.WARNING,
        )
        if outcome.skipped:
            self.message_user(
                request, f"not replayed: {skipped_text(outcome.skipped)}", messages.WARNING
            )

    @admin.action(
        description="Retry now (deliveries waiting for their next try)", permissions=["operate"]
    )
    def retry_now(self, request, queryset):
        selected = list(queryset.values_list("event_id", flat=True))
        outcome = delivery_actions.delivery_retry_now(
            event_ids=selected, actor=request.user.get_username()
        )
        self.message_user(
            request,
            f"{len(outcome.done)} of {len(selected)} selected deliveries due now",
            level=messages.SUCCESS if outcome.done else messages.WARNING,
        )
        if outcome.skipped:
            self.message_user(
                request, f"not retried: {skipped_text(outcome.skipped)}", messages.WARNING
            )
