"""Receivers by origin: pause and resume, each one's health (failure streak, the last
hour's success rate and latency, what it owes) and a signed test send, as list actions and
as buttons on the endpoint's page, which also lists its newest deliveries."""

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from a2a_platform.lib.admin import ReadOnlyAdmin
from a2a_platform.lib.times import when
from webhooks import services
from webhooks.console.endpoint_probe import TestSendRefused, endpoint_send_test
from webhooks.models import Delivery, Endpoint
from webhooks.selectors import endpoint_health


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
# The endpoint's page lists its newest deliveries; the rest are one link away.
PAGE_DELIVERIES = 10


@admin.register(Endpoint)
class EndpointAdmin(ReadOnlyAdmin):
    """Receivers by origin: pause state, failure streak, the last hour's success rate and
    latency (finished attempts), and a signed test send (webhooks/console/endpoint_probe.py)."""

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
    fields = readonly_fields = (
        "origin",
        "state_shown",
        "health_shown",
        "consecutive_failures",
        "paused_at",
        "paused_reason",
        "last_success_at",
        "last_failure_at",
        "deliveries_shown",
    )
    actions = ["pause", "resume", "send_test"]
    # Pause, resume and test-send buttons above the page (outside its read-only form).
    change_form_template = "admin/webhooks/endpoint/change_form.html"
    # The page's buttons: URL name -> (the list action it runs, its label).
    BUTTONS = {
        "pause": "Pause (deliveries wait)",
        "resume": "Resume (deliver what waited)",
        "send_test": "Send a signed test event",
    }

    class Media:
        css = {"all": ["webhooks/console.css"]}

    def get_changelist(self, request, **kwargs):
        return EndpointChangeList

    def get_urls(self):
        button = self.admin_site.admin_view(self.button_view)
        return [
            path("<path:object_id>/do/<str:action>/", button, name="webhooks_endpoint_do"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = dict(extra_context or {})
        endpoint = self.get_object(request, object_id)
        if endpoint is not None and self.has_operate_permission(request):
            # Pause while it runs, resume while paused; a test send either way.
            offered = [
                "resume" if endpoint.paused_at is not None else "pause",
                "send_test",
            ]
            extra["endpoint_buttons"] = [
                (reverse("admin:webhooks_endpoint_do", args=[object_id, name]), name, label)
                for name, label in self.BUTTONS.items()
                if name in offered
            ]
        return super().change_view(request, object_id, form_url, extra_context=extra)

    def button_view(self, request, object_id, action: str):
        """A button on the endpoint's page: the list action of the same name on this one
        endpoint (the same services, audit and messages), then back to the page."""
        if action not in self.BUTTONS:
            raise Http404("no such endpoint action")
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied
        endpoint = self.get_object(request, object_id)
        if endpoint is None:
            raise Http404("no such endpoint")
        getattr(self, action)(request, Endpoint.objects.filter(pk=endpoint.pk))
        return HttpResponseRedirect(reverse("admin:webhooks_endpoint_change", args=[endpoint.pk]))

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
        return when(obj.last_success_at)

    @admin.display(description="last failure", ordering="last_failure_at")
    def last_failure(self, obj: Endpoint) -> str:
        return when(obj.last_failure_at)

    @admin.display(description="health")
    def health_shown(self, obj: Endpoint):
        h = self._health(obj)
        context = {
            "rate": _rate(h),
            "latency": _latency(h),
            "owes": self.owed(obj),
            "since": when(h["failingSince"]) if h["failingSince"] else "-",
        }
        return render_to_string("admin/webhooks/endpoint/health.html", context)

    @admin.display(description="deliveries (newest first)")
    def deliveries_shown(self, obj: Endpoint):
        rows = list(
            Delivery.objects.filter(binding__endpoint=obj)
            .select_related("task__agent", "binding__config")
            .order_by("-id")[:PAGE_DELIVERIES]
        )
        context = {
            "rows": rows,
            "delivery_url": reverse("admin:webhooks_delivery_changelist"),
            "all_url": reverse("admin:webhooks_delivery_changelist")
            + f"?binding__endpoint__id__exact={obj.pk}",
            "task_url": reverse("admin:tasks_task_changelist"),
        }
        return render_to_string("admin/webhooks/endpoint/deliveries.html", context)

    @admin.action(description="Pause (deliveries wait)", permissions=["operate"])
    def pause(self, request, queryset):
        for endpoint in queryset:
            services.endpoint_pause(endpoint_pk=endpoint.pk, actor=request.user.get_username())
        self.message_user(request, f"paused {queryset.count()} endpoint(s)")

    @admin.action(description="Resume (deliver what waited)", permissions=["operate"])
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
