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
from a2a_platform.api.errors import not_found
from a2a_platform.api.permissions import has_scoped_perm
from a2a_platform.api.resources import StrictBooleanFilter, int_path, positive_id_param
from a2a_platform.api.views import ApiListView, ApiView
from tasks.api.serializers import WireModelSerializer, WireSerializer
from webhooks.console import dashboard
from webhooks.models import Alert, AlertKind, Endpoint
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


class DashboardAgentSerializer(WireSerializer):
    slug = serializers.SlugField()
    name = serializers.CharField()
    enabled = serializers.BooleanField()
    cardServable = serializers.BooleanField(help_text="its card is served now")
    card = serializers.CharField(help_text='how its card is answered now: "served", "503: ..."')
    capabilities = CapabilitiesSerializer()
    deliveries = serializers.DictField(
        required=False, help_text="its delivery figures (the deliveries section)"
    )


class DashboardSerializer(WireSerializer):
    """The dashboard's figures (webhooks/console/dashboard.py); a section the caller may not
    see is left out."""

    generatedAt = serializers.DateTimeField()
    sections = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(dashboard.SECTIONS)),
        help_text="the sections included",
    )
    readiness = serializers.DictField(help_text="the readiness checks, as /readyz")
    agents = DashboardAgentSerializer(many=True)
    chart = serializers.DictField(required=False, help_text="deliveries: the per-minute window")
    totals = serializers.DictField(
        child=serializers.IntegerField(), required=False, help_text="deliveries: totals"
    )
    endpoints = serializers.DictField(required=False, help_text="endpoints: counts and rows")
    alerts = serializers.DictField(required=False, help_text="alerts: open count and newest")
    rebinds = serializers.ListField(
        child=serializers.DictField(), required=False, help_text="rebinds: the open ones"
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
