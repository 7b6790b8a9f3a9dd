"""`/api/v1/endpoints/`: the receiver origins deliveries go to, with their health (pause,
failure streak and since when, what they owe, the last hour's success rate and latency);
pause and resume through the same services as the admin's actions (webhooks/services.py,
audited as `api:<user>`). Permissions are the admin's: `webhooks.view_endpoint` to read
(read scope), `webhooks.change_endpoint` to pause or resume (operate scope).
"""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response

from a2a_platform.api.errors import not_found
from a2a_platform.api.resources import (
    ENDPOINT_ID,
    ResourceMethods,
    StrictBooleanFilter,
    positive_id_param,
)
from a2a_platform.api.views import ApiListView, ApiView
from tasks.api.serializers import WireSerializer
from webhooks import selectors, services
from webhooks.models import Endpoint


class EndpointFilter(django_filters.FilterSet):
    paused = StrictBooleanFilter(help_text="true: paused by an operator")
    failing = StrictBooleanFilter(help_text="true: its last deliveries failed")

    class Meta:
        model = Endpoint
        fields: list[str] = []

    def filter_queryset(self, queryset):
        data = self.form.cleaned_data
        return selectors.endpoint_list(paused=data.get("paused"), failing=data.get("failing"))


class LastHourSerializer(WireSerializer):
    attempts = serializers.IntegerField(help_text="finished attempts in the last hour")
    succeeded = serializers.IntegerField(help_text="of which answered 2xx")
    successRate = serializers.FloatField(allow_null=True, help_text="0..1; null: no attempt")
    meanLatencyMs = serializers.FloatField(allow_null=True)
    maxLatencyMs = serializers.FloatField(allow_null=True)


class HealthSerializer(WireSerializer):
    paused = serializers.BooleanField()
    pausedAt = serializers.DateTimeField(allow_null=True)
    pausedReason = serializers.CharField(allow_blank=True)
    failing = serializers.BooleanField()
    consecutiveFailures = serializers.IntegerField()
    failingSince = serializers.DateTimeField(
        allow_null=True, help_text="its first failed attempt after its last success"
    )
    lastSuccessAt = serializers.DateTimeField(allow_null=True)
    lastFailureAt = serializers.DateTimeField(allow_null=True)
    pending = serializers.IntegerField(help_text="deliveries waiting to be sent")
    sending = serializers.IntegerField()
    held = serializers.IntegerField(help_text="held for a rebind's new channel")
    lastHour = LastHourSerializer()


class EndpointSerializer(WireSerializer):
    id = serializers.IntegerField()
    origin = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")
    health = serializers.SerializerMethodField()

    @extend_schema_field(HealthSerializer)
    def get_health(self, endpoint: Endpoint) -> dict:
        return HealthSerializer(self.context["health"][endpoint.pk]).data


class PauseSerializer(WireSerializer):
    reason = serializers.CharField(
        max_length=300, required=False, default="paused by an operator", allow_blank=False
    )


class EndpointView(ResourceMethods, ApiView):
    read_perm = "webhooks.view_endpoint"
    write_perm = "webhooks.change_endpoint"
    serializer_class = EndpointSerializer

    def endpoint(self, endpoint_id: str) -> Endpoint:
        endpoint = selectors.endpoint_read(positive_id_param("endpointId", endpoint_id))
        if endpoint is None:
            raise not_found(f"no endpoint {endpoint_id}")
        return endpoint

    def render(self, endpoint: Endpoint) -> Response:
        health = selectors.endpoint_health([endpoint])
        return Response(EndpointSerializer(endpoint, context={"health": health}).data)


class EndpointList(ApiListView, EndpointView):
    """Endpoints by origin (cursor pages), each with its health."""

    filterset_class = EndpointFilter
    ordering = "origin"
    ordering_fields = ["origin", "created_at"]

    def get_queryset(self):
        return selectors.endpoint_list()

    def get(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        health = selectors.endpoint_health(page)
        data = EndpointSerializer(page, many=True, context={"health": health}).data
        return self.get_paginated_response(data)


class EndpointDetail(EndpointView):
    @extend_schema(parameters=[ENDPOINT_ID])
    def get(self, request, endpoint_id):
        return self.render(self.endpoint(endpoint_id))


class EndpointPause(EndpointView):
    """Pause: its deliveries wait (not tried, not dead-lettered) until it is resumed.
    Pausing a paused endpoint keeps its first pause (time and reason); both are audited."""

    @extend_schema(request=PauseSerializer, responses=EndpointSerializer, parameters=[ENDPOINT_ID])
    def post(self, request, endpoint_id):
        endpoint = self.endpoint(endpoint_id)
        body = PauseSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.endpoint_pause(
            endpoint_pk=endpoint.pk, actor=self.actor, reason=body.validated_data["reason"]
        )
        return self.render(self.endpoint(endpoint_id))


class EndpointResume(EndpointView):
    """Resume: what waited on it is due again (its failure streak is reset)."""

    @extend_schema(request=None, responses=EndpointSerializer, parameters=[ENDPOINT_ID])
    def post(self, request, endpoint_id):
        endpoint = self.endpoint(endpoint_id)
        services.endpoint_resume(endpoint_pk=endpoint.pk, actor=self.actor)
        return self.render(self.endpoint(endpoint_id))
