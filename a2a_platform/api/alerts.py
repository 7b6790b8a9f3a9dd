"""`/api/v1/alerts/` (list: open or resolved, agent, kind; resolve through
webhooks.services.alert_resolve, audited) and `/api/v1/dashboard` (the admin dashboard's
figures, computed by webhooks/console/dashboard.py, with the sections the caller's scoped
permissions show)."""

from __future__ import annotations

import django_filters
from django.db.models import Q
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from a2a_platform.api.agents import CapabilitiesSerializer
from a2a_platform.api.endpoints import LastHourSerializer
from a2a_platform.api.errors import not_found
from a2a_platform.api.permissions import has_scoped_perm
from a2a_platform.api.resources import StrictBooleanFilter, int_path, positive_id_param
from a2a_platform.api.views import ApiListView, ApiView
from agents.models import PushChannelPolicy
from tasks.api.serializers import WireModelSerializer, WireSerializer
from webhooks.console import dashboard
from webhooks.models import Alert, AlertKind, Endpoint, RebindState
from webhooks.services import alert_resolve


class AlertSerializer(WireModelSerializer):
    endpoint = serializers.CharField(source="endpoint.origin", allow_null=True, default=None)
    rebind = serializers.UUIDField(source="rebind_id", allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")
    lastSeenAt = serializers.DateTimeField(source="last_seen_at")
    resolvedAt = serializers.DateTimeField(source="resolved_at", allow_null=True)

    class Meta:
        model = Alert
        fields = [
            "id",
            "kind",
            "message",
            "count",
            "endpoint",
            "rebind",
            "createdAt",
            "lastSeenAt",
            "resolvedAt",
        ]


class AlertFilter(django_filters.FilterSet):
    open = StrictBooleanFilter(field_name="resolved_at", lookup_expr="isnull")
    kind = django_filters.ChoiceFilter(choices=AlertKind.choices)
    agent = django_filters.CharFilter(method="of_agent", max_length=64)

    class Meta:
        model = Alert
        fields = ["open", "kind", "agent"]

    def of_agent(self, queryset, name, value):
        # An alert concerns an agent through its rebind, or an endpoint its tasks post to.
        endpoints = Endpoint.objects.filter(bindings__config__task__agent__slug=value)
        return queryset.filter(Q(rebind__agent__slug=value) | Q(endpoint__in=endpoints))


class AlertList(ApiListView):
    read_perm = "webhooks.view_alert"
    serializer_class = AlertSerializer
    filterset_class = AlertFilter
    ordering = "-last_seen_at"
    ordering_fields = ["last_seen_at", "created_at", "id"]

    def get_queryset(self):
        return Alert.objects.select_related("endpoint")


class AlertResolve(ApiView):
    perms = {"POST": "webhooks.change_alert"}
    serializer_class = AlertSerializer

    @extend_schema(request=None, responses={200: AlertSerializer}, parameters=[int_path("id")])
    def post(self, request, pk):
        pk = positive_id_param("alertId", pk)
        if not Alert.objects.filter(pk=pk).exists():
            raise not_found(f"no alert {pk}")
        alert_resolve(alert_pk=pk, actor=self.actor)
        return Response(AlertSerializer(Alert.objects.select_related("endpoint").get(pk=pk)).data)


def _when(help_text: str = "") -> serializers.DateTimeField:
    return serializers.DateTimeField(allow_null=True, help_text=help_text)


def _age(help_text: str) -> serializers.FloatField:
    return serializers.FloatField(allow_null=True, help_text=help_text)


class CheckSerializer(WireSerializer):
    name = serializers.CharField(help_text='the check: "database", "broker", "hosted <spec>", ...')
    ok = serializers.BooleanField()
    detail = serializers.CharField(allow_blank=True, help_text="why, in words")


class WorkerSerializer(WireSerializer):
    id = serializers.IntegerField(help_text="the workers page's id")
    hostname = serializers.CharField()
    queues = serializers.ListField(child=serializers.CharField())
    beatAgeSeconds = _age("seconds since its last heartbeat")
    live = serializers.BooleanField(help_text="its heartbeat is fresh (heartbeatFreshSeconds)")
    startedAt = _when()
    backlogReenqueued = serializers.BooleanField(
        help_text="it re-enqueued its due backlog since it started"
    )
    hosted = serializers.DictField(
        child=serializers.CharField(allow_null=True),
        help_text="per hosted executor spec: null when it loads there, else why not",
    )


class WebInstanceSerializer(WireSerializer):
    name = serializers.CharField(help_text="host:pid")
    thisInstance = serializers.BooleanField(help_text="the instance that answered (its state now)")
    beatAgeSeconds = _age("seconds since its last heartbeat")
    live = serializers.BooleanField()
    ready = serializers.BooleanField()
    draining = serializers.BooleanField()
    failing = serializers.DictField(
        child=serializers.CharField(), help_text="per failing check: why"
    )
    startedAt = _when()


class ReadinessSerializer(WireSerializer):
    instance = serializers.CharField(help_text="the answering instance, host:pid")
    ready = serializers.BooleanField(help_text="as /readyz answers")
    draining = serializers.BooleanField()
    checks = CheckSerializer(many=True)
    workers = WorkerSerializer(many=True)
    webInstances = WebInstanceSerializer(many=True)
    heartbeatFreshSeconds = serializers.IntegerField()


class PerMinuteSerializer(WireSerializer):
    delivered = serializers.ListField(child=serializers.IntegerField(), help_text="oldest first")
    failed = serializers.ListField(child=serializers.IntegerField(), help_text="oldest first")


class DeliveredFailedSerializer(WireSerializer):
    delivered = serializers.IntegerField()
    failed = serializers.IntegerField()


class AgentDeliveriesSerializer(WireSerializer):
    queueDepth = serializers.IntegerField(help_text="pending + sending")
    pending = serializers.IntegerField()
    sending = serializers.IntegerField()
    held = serializers.IntegerField()
    dead = serializers.IntegerField(help_text="dead letters")
    oldestPendingAgeSeconds = _age("age of the oldest delivery owed")
    oldestPendingAt = _when()
    perMinute = PerMinuteSerializer(help_text="attempts per minute over the chart's window")
    lastHour = DeliveredFailedSerializer()


class DashboardAgentSerializer(WireSerializer):
    id = serializers.IntegerField()
    slug = serializers.SlugField()
    name = serializers.CharField()
    enabled = serializers.BooleanField()
    cardServable = serializers.BooleanField(help_text="its card is served now")
    card = serializers.CharField(help_text='how its card is answered now: "served", "503: ..."')
    capabilities = CapabilitiesSerializer()
    deliveries = AgentDeliveriesSerializer(
        required=False, help_text="its delivery figures (the deliveries section)"
    )


class ChartSerializer(WireSerializer):
    start = serializers.DateTimeField(help_text="the first minute of the window")
    minutes = serializers.IntegerField()


class TotalsSerializer(WireSerializer):
    queueDepth = serializers.IntegerField()
    held = serializers.IntegerField()
    dead = serializers.IntegerField()


class DashboardEndpointSerializer(WireSerializer):
    id = serializers.IntegerField()
    origin = serializers.CharField()
    state = serializers.ChoiceField(choices=["ok", "failing", "paused"])
    consecutiveFailures = serializers.IntegerField()
    pausedAt = _when()
    pausedReason = serializers.CharField(allow_blank=True)
    lastFailureAt = _when()
    lastSuccessAt = _when()
    lastHour = LastHourSerializer()


class DashboardEndpointsSerializer(WireSerializer):
    total = serializers.IntegerField()
    failing = serializers.IntegerField()
    paused = serializers.IntegerField()
    rows = DashboardEndpointSerializer(many=True, help_text="the troubled first, then the rest")


class DashboardAlertSerializer(WireSerializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=AlertKind.choices)
    title = serializers.CharField(help_text="the kind in words")
    message = serializers.CharField()
    count = serializers.IntegerField()
    endpoint = serializers.CharField(allow_null=True, help_text="its endpoint's origin")
    lastSeenAt = _when()


class DashboardAlertsSerializer(WireSerializer):
    open = serializers.IntegerField()
    newest = DashboardAlertSerializer(many=True)


class DashboardRebindSerializer(WireSerializer):
    id = serializers.UUIDField()
    agent = serializers.SlugField()
    state = serializers.ChoiceField(choices=RebindState.choices)
    stateLabel = serializers.CharField(help_text="the state in words")
    policy = serializers.ChoiceField(choices=PushChannelPolicy.choices)
    plannedMoves = serializers.IntegerField()
    planningDone = serializers.BooleanField()
    done = serializers.IntegerField(help_text="moves done or finished on the old channel")
    progress = serializers.FloatField(help_text="done / plannedMoves, 0..1")
    percent = serializers.IntegerField()
    onOldVersion = serializers.IntegerField(help_text="live tasks still on the old version")
    orphaned = serializers.IntegerField()
    deadline = _when()
    startsAt = _when("a scheduled rebind's start")
    deadlineInSeconds = _age("seconds to its deadline")


class DashboardSerializer(WireSerializer):
    """The dashboard's figures (webhooks/console/dashboard.py); a section the caller may not
    see is left out."""

    generatedAt = serializers.DateTimeField()
    sections = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(dashboard.SECTIONS)),
        help_text="the sections included",
    )
    readiness = ReadinessSerializer(
        help_text="this instance's readiness, workers and web instances"
    )
    agents = DashboardAgentSerializer(many=True)
    chart = ChartSerializer(required=False, help_text="deliveries: the per-minute window")
    totals = TotalsSerializer(required=False, help_text="deliveries: totals")
    endpoints = DashboardEndpointsSerializer(required=False, help_text="endpoints: counts, rows")
    alerts = DashboardAlertsSerializer(required=False, help_text="alerts: open count and newest")
    rebinds = DashboardRebindSerializer(
        many=True, required=False, help_text="rebinds: the open ones"
    )


class Dashboard(ApiView):
    """Readiness, per agent capabilities and delivery figures, endpoints, alerts and open
    rebinds: each section as the caller's permissions (and token scope) allow."""

    read_perm = "agents.view_agent"

    @extend_schema(responses={200: DashboardSerializer})
    def get(self, request):
        sections = frozenset(
            section
            for section, perm in dashboard.SECTION_PERMISSIONS.items()
            if has_scoped_perm(request, perm)
        )
        return Response(dashboard.dashboard_data(sections=sections))
