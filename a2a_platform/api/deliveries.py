"""`/api/v1/deliveries/`: list (filters: state, kind, task, agent, endpoint), inspect with the
attempt timeline, and replay deliveries. The admin's permissions: `webhooks.view_delivery`
to read, `webhooks.change_delivery` to replay."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from a2a_platform.api.errors import not_found
from a2a_platform.api.filters import UtcDateTimeFilter
from a2a_platform.api.resources import uuid_param, uuid_path
from a2a_platform.api.views import ApiListView, ApiView
from tasks.api.serializers import WireModelSerializer, WireSerializer
from webhooks import selectors
from webhooks.console.delivery_actions import delivery_replay_explained, delivery_retry_now
from webhooks.models import Delivery, DeliveryAttempt, DeliveryKind, DeliveryState


class AttemptSerializer(WireModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = [
            "number",
            "url",
            "started_at",
            "duration_ms",
            "status",
            "error_class",
            "manual",
            "request_headers",
            "response_excerpt",
        ]


class DeliverySerializer(WireModelSerializer):
    id = serializers.UUIDField(source="event_id")
    taskId = serializers.UUIDField(source="task_id")
    agent = serializers.CharField(source="task.agent.slug")
    configId = serializers.CharField(source="config.config_id")
    bindingVersion = serializers.IntegerField(source="binding.version")
    endpoint = serializers.CharField(source="binding.endpoint.origin")
    kind = serializers.ChoiceField(choices=[k.value for k in DeliveryKind])

    class Meta:
        model = Delivery
        fields = [
            "id",
            "taskId",
            "agent",
            "configId",
            "bindingVersion",
            "endpoint",
            "seq",
            "kind",
            "state",
            "attempts",
            "next_attempt_at",
            "last_status",
            "last_error",
            "created_at",
            "finished_at",
        ]


class DeliveryDetailSerializer(DeliverySerializer):
    attempts_log = AttemptSerializer(many=True)

    class Meta(DeliverySerializer.Meta):
        fields = [*DeliverySerializer.Meta.fields, "attempts_log"]


class DeliveryFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=DeliveryState.choices)
    kind = django_filters.ChoiceFilter(choices=[(k.value, k.value) for k in DeliveryKind])
    task = django_filters.UUIDFilter(field_name="task_id")
    agent = django_filters.CharFilter(field_name="task__agent__slug", max_length=64)
    endpoint = django_filters.CharFilter(field_name="binding__endpoint__origin", max_length=300)
    since = UtcDateTimeFilter(
        field_name="created_at", lookup_expr="gte", help_text="written at or after this time"
    )

    class Meta:
        model = Delivery
        fields = ["state", "kind", "task", "agent", "endpoint", "since"]


class DeliveryView(ApiView):
    read_perm = "webhooks.view_delivery"
    write_perm = "webhooks.change_delivery"


class DeliveryList(DeliveryView, ApiListView):
    """Deliveries, newest first (cursor pages)."""

    serializer_class = DeliverySerializer
    filterset_class = DeliveryFilter
    ordering = "-id"
    ordering_fields = ["id", "created_at", "seq"]

    def get_queryset(self):
        return selectors.delivery_list()


class DeliveryDetail(DeliveryView):
    serializer_class = DeliveryDetailSerializer

    @extend_schema(parameters=[uuid_path("event_id")])
    def get(self, request, event_id):
        delivery = selectors.delivery_by_event_id(uuid_param("deliveryId", event_id))
        if delivery is None:
            raise not_found(f"no delivery {event_id}")
        return Response(DeliveryDetailSerializer(delivery).data)


class ReplaySerializer(WireSerializer):
    ids = serializers.ListField(child=serializers.UUIDField(), min_length=1, max_length=1000)


class SkippedSerializer(WireSerializer):
    id = serializers.UUIDField()
    reason = serializers.ChoiceField(
        choices=[
            "not_found",
            "not_waiting",
            "due",
            "endpoint_paused",
            "config_deleted",
            "not_replayable",
            "notice_not_awaited",
        ]
    )
    message = serializers.CharField()


class ReplayResultSerializer(WireSerializer):
    replayed = serializers.IntegerField()
    requested = serializers.IntegerField()
    skipped = SkippedSerializer(many=True, help_text="each delivery left alone, and why")


class DeliveryReplay(DeliveryView):
    """Re-open dead-lettered or delivered deliveries (audited). Others are left as they are,
    each listed in `skipped` with the reason."""

    serializer_class = ReplaySerializer

    @extend_schema(request=ReplaySerializer, responses=ReplayResultSerializer)
    def post(self, request):
        data = ReplaySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        outcome = delivery_replay_explained(event_ids=data.validated_data["ids"], actor=self.actor)
        return Response(ReplayResultSerializer(outcome).data)


class RetryResultSerializer(WireSerializer):
    retried = serializers.IntegerField()
    requested = serializers.IntegerField()
    skipped = SkippedSerializer(many=True, help_text="each delivery left alone, and why")


class DeliveryRetry(DeliveryView):
    """Retry now: deliveries waiting for their next try are tried at once (attempt count and
    schedule kept; audited). Others are left as they are, each listed in `skipped`."""

    serializer_class = ReplaySerializer

    @extend_schema(request=ReplaySerializer, responses=RetryResultSerializer)
    def post(self, request):
        data = ReplaySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        ids = data.validated_data["ids"]
        outcome = delivery_retry_now(event_ids=ids, actor=self.actor)
        answer = {"retried": len(outcome.done), "requested": len(set(ids))}
        return Response(RetryResultSerializer({**answer, "skipped": outcome.skipped}).data)
