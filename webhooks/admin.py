"""Operator views of webhook delivery: deliveries with their attempt timeline, replay,
endpoints (pause/resume), push configs with their binding versions, alerts, and rebinds with
their moves (advance, cut over, abort; starting one is `manage.py rebind`, docs/rebinds.md)."""

import collections
import json
import uuid
from datetime import UTC

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery
from django.http import Http404, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from agents.admin import SECRET_FIELDS, SecretLookupsRefused
from agents.models import SigningKey
from agents.signing import SigningKeyError
from tasks.admin import TaskAdmin
from tasks.models import Task
from webhooks import delivery_actions, key_actions, rebind_console, rebind_machine, services
from webhooks import rebind as rebinds
from webhooks.delivery import retry_schedule
from webhooks.endpoint_probe import TestSendRefused, endpoint_send_test, url_shown
from webhooks.errors import RebindConflict, RebindInvalid, WebhookError
from webhooks.forms import RebindForm
from webhooks.models import (
    OPEN_DELIVERY_STATES,
    Alert,
    ChannelMove,
    Delivery,
    DeliveryAttempt,
    DeliveryState,
    Endpoint,
    MoveState,
    OperatorAction,
    PushBinding,
    PushConfig,
    Rebind,
)
from webhooks.rebind_checks import rebind_preview
from webhooks.rebind_machine import IllegalRebindTransition
from webhooks.selectors import (
    binding_secrets_masked,
    binding_status,
    endpoint_health,
    task_channel_history,
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


class ReadOnlyAdmin(SecretLookupsRefused, admin.ModelAdmin):
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


def exact_time(value) -> str:
    """A timestamp to the millisecond, in UTC (DESIGN.md "Conventions"): triage compares
    attempts seconds apart, which the admin's default "Dec. 1, 2026, 3:04 p.m." hides."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def exact_time_cell(value):
    """`exact_time` on two lines (date, then time) for a narrow list column."""
    if value is None:
        return "-"
    date, time, zone = exact_time(value).split(" ")
    return format_html('<span class="a2a-time">{}<br>{} {}</span>', date, time, zone)


def pretty(value) -> str:
    """JSON (a dict, or text that parses as JSON) indented in a wrapping <pre>; other text
    as is, wrapped too. Autoescaped."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return format_html('<pre class="a2a-pre">{}</pre>', value) if value else "-"
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=isinstance(value, dict))
    return format_html('<pre class="a2a-pre">{}</pre>', text)


def tries_per_run() -> int:
    """The denominator of "attempt n of m": the first try and one per wait of the outage
    schedule (A2A_WEBHOOK_RETRY_SCHEDULE); a run restarts at a replay. 401/403 answers are
    retried on the shorter auth schedule (webhooks/retry_policy.py)."""
    return len(retry_schedule()) + 1


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
        return exact_time(obj.started_at)

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
        return pretty(obj.request_headers)  # stored redacted (delivery_headers.redact)

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
    """Open deliveries held by a paused endpoint (they wait; nothing is tried)."""

    title = "endpoint paused"
    parameter_name = "paused"

    def lookups(self, request, model_admin):
        return [("yes", "held by a paused endpoint")]

    def queryset(self, request, queryset):
        if self.value() != "yes":
            return queryset
        return queryset.filter(
            state__in=OPEN_DELIVERY_STATES, binding__endpoint__paused_at__isnull=False
        )


def _skipped_text(skipped) -> str:
    """The reasons an action left deliveries alone, counted: "2 delivered: only …"."""
    counts = collections.Counter(s.message for s in skipped)
    return "; ".join(f"{n} × {message}" for message, n in counts.items())


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    """Deliveries newest first: when, what, where to, how it stands (a paused endpoint's
    held delivery says so), its try out of the run's tries and the last failure in words."""

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
        "binding",
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
        return exact_time_cell(obj.created_at)

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
                f"{endpoint.origin} paused at {exact_time(endpoint.paused_at)}: "
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

    @admin.display(description="attempt")
    def attempt_of(self, obj):
        return f"{obj.attempts} of {tries_per_run()}"

    @admin.display(description="created")
    def created_exact(self, obj):
        return exact_time(obj.created_at)

    @admin.display(description="finished")
    def finished_exact(self, obj):
        return exact_time(obj.finished_at)

    @admin.display(description="next try", ordering="next_attempt_at")
    def next_try(self, obj):
        if obj.state not in OPEN_DELIVERY_STATES:
            return "-"
        if obj.binding.endpoint.paused_at is not None:
            return "held (endpoint paused)"
        return exact_time_cell(obj.next_attempt_at)

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
                request, f"not replayed: {_skipped_text(outcome.skipped)}", messages.WARNING
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
                request, f"not retried: {_skipped_text(outcome.skipped)}", messages.WARNING
            )


class EndpointChangeList(ChangeList):
    """The endpoint list with each row's health (webhooks/selectors.py endpoint_health: the
    last hour's success rate and latency, what it owes) read once for the page."""

    def get_results(self, request):
        super().get_results(request)
        health = endpoint_health(self.result_list)
        for endpoint in self.result_list:
            endpoint.health = health[endpoint.pk]


def _rate(health: dict) -> str:
    hour = health["lastHour"]
    if not hour["attempts"]:
        return "-"
    rate = hour["successRate"] * 100
    text = f"{rate:.1f}% of {hour['attempts']}"
    if rate < 90:
        return format_html('<span class="a2a-rate-bad">{}</span>', text)
    return text


def _latency(health: dict) -> str:
    hour = health["lastHour"]
    if not hour["attempts"]:
        return "-"
    return f"{hour['meanLatencyMs']:.0f} ms mean, {hour['maxLatencyMs']:.0f} ms max"


# A test send waits for the receiver (up to the delivery timeout): a few per click.
MAX_TEST_SENDS = 5


@admin.register(Endpoint)
class EndpointAdmin(ReadOnlyAdmin):
    """Receivers by origin: pause state, failure streak, the last hour's success rate and
    latency (finished attempts), and a signed test send (webhooks/endpoint_probe.py)."""

    list_display = (
        "origin",
        "state_shown",
        "consecutive_failures",
        "success_rate",
        "latency",
        "owed",
        "last_success",
        "last_failure",
    )
    list_filter = ("paused_at",)
    search_fields = ("origin",)
    readonly_fields = ("health_shown",)
    actions = ["pause", "resume", "send_test"]

    class Media:
        css = {"all": ["webhooks/console.css"]}

    def get_changelist(self, request, **kwargs):
        return EndpointChangeList

    def _health(self, obj: Endpoint) -> dict:
        health = getattr(obj, "health", None)
        if health is None:  # the change page: one endpoint
            health = obj.health = endpoint_health([obj])[obj.pk]
        return health

    @admin.display(description="state")
    def state_shown(self, obj: Endpoint):
        if obj.paused_at is not None:
            return format_html(
                '<span class="a2a-chip a2a-paused" title="{}">paused</span>', obj.paused_reason
            )
        if obj.consecutive_failures:
            return mark_safe('<span class="a2a-chip a2a-dead">failing</span>')
        return mark_safe('<span class="a2a-chip a2a-delivered">ok</span>')

    @admin.display(description="success (last hour)")
    def success_rate(self, obj: Endpoint):
        return _rate(self._health(obj))

    @admin.display(description="latency (last hour)")
    def latency(self, obj: Endpoint):
        return _latency(self._health(obj))

    @admin.display(description="owes")
    def owed(self, obj: Endpoint) -> str:
        h = self._health(obj)
        return f"{h['pending']} pending, {h['sending']} sending, {h['held']} held"

    @admin.display(description="last success", ordering="last_success_at")
    def last_success(self, obj: Endpoint) -> str:
        return exact_time(obj.last_success_at)

    @admin.display(description="last failure", ordering="last_failure_at")
    def last_failure(self, obj: Endpoint) -> str:
        return exact_time(obj.last_failure_at)

    @admin.display(description="health")
    def health_shown(self, obj: Endpoint):
        h = self._health(obj)
        since = exact_time(h["failingSince"]) if h["failingSince"] else "-"
        return format_html(
            "success (last hour): {}<br>latency (last hour): {}<br>owes: {}<br>failing since: {}",
            _rate(h),
            _latency(h),
            self.owed(obj),
            since,
        )

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

    @admin.action(
        description="Send a signed test event (to the newest live push config's URL)",
        permissions=["operate"],
    )
    def send_test(self, request, queryset):
        endpoints = list(queryset[: MAX_TEST_SENDS + 1])
        if len(endpoints) > MAX_TEST_SENDS:
            self.message_user(
                request,
                f"select at most {MAX_TEST_SENDS} endpoints for a test send: nothing was sent",
                messages.ERROR,
            )
            return
        actor = request.user.get_username()
        for endpoint in endpoints:
            try:
                sent = endpoint_send_test(endpoint_pk=endpoint.pk, actor=actor)
            except TestSendRefused as exc:
                self.message_user(request, f"{endpoint.origin}: {exc}", messages.ERROR)
                continue
            answer = f"HTTP {sent.status}" if sent.status is not None else "no answer"
            text = (
                f"{endpoint.origin}: test event {sent.event_id} to {sent.url} "
                f"({sent.channel}): {answer} in {sent.duration_ms:.0f} ms"
            )
            if sent.ok:
                self.message_user(request, text, messages.SUCCESS)
            else:
                self.message_user(request, f"{text}: {sent.detail}", messages.ERROR)


class BindingInline(ReadOnlyInline):
    """A config's binding versions, credentials masked (selectors.binding_secrets_masked:
    whether a token and credentials are set, the scheme; nothing decrypted)."""

    model = PushBinding
    fields = (
        "version",
        "status",
        "url_masked",
        "credentials",
        "endpoint",
        "created_at",
        "activated_at",
        "retired_at",
    )

    @admin.display(description="status")
    def status(self, obj: PushBinding) -> str:
        return binding_status(obj)

    @admin.display(description="URL")
    def url_masked(self, obj: PushBinding) -> str:
        return url_shown(obj.url)

    @admin.display(description="credentials")
    def credentials(self, obj: PushBinding) -> str:
        masked = binding_secrets_masked(obj)
        auth = masked["authentication"]
        parts = [f"token {masked['token'] or 'none'}"]
        if auth:
            parts.append(
                f"{auth['scheme'] or 'no scheme'}: credentials {auth['credentials'] or 'none'}"
            )
        return "; ".join(parts)


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


# The rebind's page shows these as they were asked for; what changes as it runs (its state,
# deadline, counts, moves, times) is the console's, from its one payload (rebind_console.py),
# so that nothing below the console still says "draining" once it is over.
REBIND_REQUEST_FIELDS = (
    "id",
    "agent",
    "rotate_key",
    "move_from",
    "move_to",
    "move_origin",
    "config",
    "new_url",
    "new_auth_scheme",
    "replaces_credentials",
    "client_binding",
    "policy",
    "in_flight_tasks",
    "deadline_seconds",
    "on_timeout",
    "actor",
    "forced",
    "scheduled_for",
    "old_key",
    "new_key",
    "created_at",
)


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
    # A read-only field is rendered whatever `exclude` says: the secrets are left out here.
    fields = readonly_fields = [f for f in REBIND_REQUEST_FIELDS if f not in SECRET_FIELDS]
    exclude = ("new_token_encrypted", "new_credentials_encrypted")
    actions = ["advance", "cut_over", "abort"]
    change_list_template = "admin/webhooks/rebind/change_list.html"
    # The stock read-only form below a console: chips, progress, countdown, the live list of
    # tasks still on the old version and the operator's decisions (webhooks/rebind_console.py).
    change_form_template = "admin/webhooks/rebind/change_form.html"

    def has_run_rebind_permission(self, request) -> bool:
        return request.user.has_perm("webhooks.run_rebind")

    def get_urls(self):
        wizard = self.admin_site.admin_view(self.wizard_view)
        retire = self.admin_site.admin_view(self.retire_key_view)
        live = self.admin_site.admin_view(self.live_view)
        act = self.admin_site.admin_view(self.action_view)
        return [
            path("start/", wizard, name="webhooks_rebind_start"),
            path("retire-key/<int:key_pk>/", retire, name="webhooks_rebind_retire_key"),
            # Before the stock URLs: their `<path:object_id>/` would take these.
            path("<path:object_id>/live/", live, name="webhooks_rebind_live"),
            path("<path:object_id>/do/<str:action>/", act, name="webhooks_rebind_action"),
            *super().get_urls(),
        ]

    def _console_context(self, request, rebind: Rebind) -> dict:
        return {
            "console": rebind_console.rebind_console(rebind),
            "console_live_url": reverse("admin:webhooks_rebind_live", args=[rebind.pk]),
            "console_action_urls": {
                name: reverse("admin:webhooks_rebind_action", args=[rebind.pk, name])
                for name in rebind_console.ACTIONS
            },
            "console_task_url": reverse("admin:tasks_task_changelist"),
            "can_run_rebind": self.has_run_rebind_permission(request),
        }

    def change_view(self, request, object_id, form_url="", extra_context=None):
        rebind = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if rebind is not None and self.has_view_permission(request, rebind):
            extra.update(self._console_context(request, rebind))
            # The heading and the window's title from the payload (the JS keeps them live);
            # the row's str() names the state as stored ("cut_over") and goes stale.
            extra["subtitle"] = extra["console"]["title"]
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @admin.display(description="in-flight tasks")
    def in_flight_tasks(self, obj: Rebind) -> str:
        return rebind_console.in_flight_text(obj)

    def live_view(self, request, object_id):
        """The console's JSON, polled by webhooks/static/webhooks/rebind_page.js."""
        rebind = self.get_object(request, object_id)
        if not self.has_view_permission(request, rebind):
            raise PermissionDenied
        if rebind is None:
            raise Http404("no such rebind")
        response = JsonResponse(rebind_console.rebind_console(rebind))
        response["Cache-Control"] = "no-store"
        return response

    def action_view(self, request, object_id, action: str):
        """One decision on the rebind's page: a confirmation saying what it will do (as
        delete_confirmation does), then, once confirmed (POST confirm=yes), the service."""
        if action not in rebind_console.ACTIONS:
            raise Http404("no such rebind action")
        if not self.has_run_rebind_permission(request):
            raise PermissionDenied
        rebind = self.get_object(request, object_id)
        if rebind is None:
            raise Http404("no such rebind")
        back = reverse("admin:webhooks_rebind_change", args=[rebind.pk])
        operation = rebind_console.ACTIONS[action]
        if not rebind_machine.can(operation, rebind.state):
            exc = IllegalRebindTransition(operation, rebind.state)
            if action == "replay_notice":
                exc = (
                    "a notice is replayed only while the rebind drains; it is "
                    f"{rebind_console.state_label(rebind.state)}"
                )
            self.message_user(request, f"rebind {rebind.pk}: {exc}", messages.ERROR)
            return HttpResponseRedirect(back)
        data = request.POST if request.method == "POST" else request.GET
        try:
            plan = rebind_console.action_plan(rebind, action, data)
        except rebind_console.ActionInputInvalid as exc:
            self.message_user(request, f"rebind {rebind.pk}: {exc}", messages.ERROR)
            return HttpResponseRedirect(back)
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            try:
                done = self._run_action(rebind, plan, request.user.get_username())
            except (WebhookError, IllegalRebindTransition) as exc:
                self.message_user(request, f"rebind {rebind.pk}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"rebind {rebind.pk}: {done}", messages.SUCCESS)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": rebind,
            "plan": plan,
            "back": back,
            "action_url": request.path,
            "task_url": reverse("admin:tasks_task_changelist"),
            "title": f"Confirm: {plan.summary.split(':')[0]}",
            "delivery_url": reverse("admin:webhooks_delivery_changelist"),
        }
        return TemplateResponse(request, "admin/webhooks/rebind/action_confirm.html", context)

    def _run_action(self, rebind: Rebind, plan, actor: str) -> str:
        """The confirmed decision, through its rebind service (each audits itself)."""
        if plan.action == "move_now":
            n = rebinds.rebind_moves_now(rebind.pk, move_pks=plan.move_pks, actor=actor)
            return f"{n} task(s) moved now"
        if plan.action == "finish_on_old":
            n = rebinds.rebind_moves_finish_on_old(rebind.pk, move_pks=plan.move_pks, actor=actor)
            return f"{n} task(s) left to finish on the old channel"
        if plan.action == "replay_notice":
            # The deliveries admin's replay (audited there as `replay_deliveries`).
            outcome = delivery_actions.delivery_replay_explained(
                event_ids=plan.notices, actor=actor
            )
            done = f"{outcome.replayed} of {outcome.requested} dead notice(s) replayed"
            if outcome.skipped:
                done += f"; not replayed: {_skipped_text(outcome.skipped)}"
            return done
        if plan.action == "cut_over":
            done = rebinds.rebind_cutover(rebind.pk, actor=actor)
            return rebind_console.state_label(done.state)
        if plan.action == "extend":
            done = rebinds.rebind_extend(rebind.pk, seconds=plan.seconds, actor=actor)
            return f"deadline extended by {plan.minutes} min, to {exact_time(done.deadline)}"
        rebinds.rebind_abort(rebind.pk, actor=actor, reason=plan.reason)
        return "aborted"

    def retire_key_view(self, request, key_pk: int):
        """Retire a retiring signing key (linked from the agent's page): a confirmation,
        then webhooks/key_actions.py (refused while an open rebind holds the key)."""
        if not self.has_run_rebind_permission(request):
            raise PermissionDenied
        key = SigningKey.objects.filter(pk=key_pk).select_related("agent").first()
        if key is None:
            raise Http404("no such signing key")
        back = reverse("admin:agents_agent_change", args=[key.agent_id])
        if request.method == "POST":
            try:
                key_actions.signing_key_retire_checked(
                    key_pk=key.pk, actor=request.user.get_username()
                )
            except SigningKeyError as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(request, f"key {key.kid} retired", messages.SUCCESS)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "key": key,
            "back": back,
            "title": f"Retire signing key {key.kid}",
        }
        return TemplateResponse(request, "admin/webhooks/rebind/retire_key.html", context)

    def changelist_view(self, request, extra_context=None):
        extra = {"can_run_rebind": self.has_run_rebind_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def wizard_view(self, request):
        """Start a rebind in two steps: the form, then a confirmation page with every check's
        result and the blast radius (tasks on the old version by state, configs, endpoints,
        the list); nothing is written until it is confirmed."""
        if not self.has_run_rebind_permission(request):
            raise PermissionDenied
        # Links (the agent's "rotate" link) may prefill the form: ?agent=…&operations=….
        initial = {
            name: request.GET.getlist(name) if name == "operations" else request.GET[name]
            for name in ("agent", "operations", "task_id", "config_id")
            if name in request.GET
        }
        form = RebindForm(request.POST or None, initial=initial)
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
        notice = obj.notice
        if notice is None:
            return "-"
        said = [f"HTTP {notice.last_status}"] if notice.last_status else []
        said += [notice.last_error] if notice.last_error else []
        text = notice.get_state_display() + (f" ({'; '.join(said)})" if said else "")
        if notice.state == DeliveryState.DEAD and obj.state == MoveState.NOTICE_PENDING:
            return format_html('<strong class="a2a-dead">{}: task stuck on old</strong>', text)
        return text

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


class TaskChannelsAdmin(TaskAdmin):
    """tasks/admin.py's task page with the task's push channel history (the webhooks app sits
    above tasks, so it extends the task admin rather than tasks importing webhooks)."""

    readonly_fields = ("channel_history",)

    @admin.display(description="push channel history")
    def channel_history(self, obj):
        history = task_channel_history(obj)
        versions = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    v["channel"],
                    v["status"],
                    url_shown(v["url"]),
                    "token set" if v["token"] else "no token",
                    exact_time(v["createdAt"]),
                    exact_time(v["activatedAt"]),
                    exact_time(v["retiredAt"]),
                )
                for v in history["versions"]
            ),
        )
        # The receiver's last answer to each notice (its status and body, as the deliveries
        # admin's attempt timeline shows it): a dead notice keeps its task on the old channel.
        answers = rebind_console.notice_answers(n["id"] for n in history["notices"])
        notice_of = {n["id"]: n for n in history["notices"]}
        delivery_url = reverse("admin:webhooks_delivery_changelist")
        rebind_url = reverse("admin:webhooks_rebind_changelist")

        def move_state(m) -> str:
            notice = notice_of.get(m["notice"])
            label = MoveState(m["state"]).label if m["state"] in MoveState.values else m["state"]
            if m["state"] == MoveState.NOTICE_PENDING and notice and notice["state"] == "dead":
                said = rebind_console.answer_text(answers.get(m["notice"]))
                return format_html(
                    '<strong class="a2a-dead">stuck on the old channel: its notice was '
                    "dead-lettered</strong>{}",
                    f" ({said})" if said else "",
                )
            return label

        moves = format_html_join(
            "",
            '<tr data-state="{}"><td><a href="{}{}/change/">{}</a></td><td>{}</td>'
            "<td>v{} → v{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    m["state"],
                    rebind_url,
                    m["rebindId"],
                    m["rebindId"][:8],
                    m["configId"],
                    m["fromVersion"],
                    m["toVersion"] if m["toVersion"] is not None else "-",
                    move_state(m),
                    m["notice"] or "-",
                    exact_time(m["createdAt"]),
                    exact_time(m["finishedAt"]),
                )
                for m in history["moves"]
            ),
        )
        notices = format_html_join(
            "",
            '<tr data-state="{}"><td><a href="{}?q={}">{}</a></td><td>{}</td><td>{}.v{}</td>'
            '<td class="{}">{}</td><td>{}</td><td class="c-answer">{}</td><td>{}</td>'
            "<td>{}</td></tr>",
            (
                (
                    n["state"],
                    delivery_url,
                    n["id"],
                    n["id"],
                    n["kind"],
                    n["configId"],
                    n["version"],
                    "a2a-dead" if n["state"] == DeliveryState.DEAD else "",
                    DeliveryState(n["state"]).label,
                    n["attempts"],
                    rebind_console.answer_text(answers.get(n["id"])) or "-",
                    n["lastError"] or "-",
                    exact_time(n["createdAt"]),
                )
                for n in history["notices"]
            ),
        )
        return format_html(
            '<div id="channel-history">'
            '<table id="channel-versions"><caption>binding versions</caption><thead><tr>'
            "<th>channel</th><th>status</th><th>URL</th><th>token</th><th>made</th>"
            "<th>activated</th><th>retired</th></tr></thead><tbody>{}</tbody></table>"
            '<table id="channel-moves"><caption>rebind moves</caption><thead><tr>'
            "<th>rebind</th><th>config</th><th>versions</th><th>state</th><th>notice</th>"
            "<th>made</th><th>finished</th></tr></thead><tbody>{}</tbody></table>"
            '<table id="channel-notices"><caption>channel notices</caption><thead><tr>'
            "<th>notice</th><th>kind</th><th>on</th><th>state</th><th>attempts</th>"
            "<th>receiver's last answer</th><th>last error</th><th>made</th></tr></thead>"
            "<tbody>{}</tbody></table></div>",
            versions,
            moves,
            notices,
        )


admin.site.unregister(Task)
admin.site.register(Task, TaskChannelsAdmin)
