"""Delivery API for integrators (staff token): list, inspect and replay deliveries.

Staff need the delivery permissions the admin asks for: view to list and inspect, change to
replay."""

from __future__ import annotations

import uuid

from rest_framework import serializers, status
from rest_framework.authentication import TokenAuthentication
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import SAFE_METHODS, IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from webhooks import selectors
from webhooks.models import Delivery, DeliveryAttempt, DeliveryState
from webhooks.services import delivery_replay


class AttemptSerializer(serializers.ModelSerializer):
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


class DeliverySerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="event_id")
    taskId = serializers.UUIDField(source="task_id")
    agent = serializers.CharField(source="task.agent.slug")
    configId = serializers.CharField(source="config.config_id")
    bindingVersion = serializers.IntegerField(source="binding.version")
    endpoint = serializers.CharField(source="binding.endpoint.origin")

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


class DeliveryPermission(IsAdminUser):
    """Staff with the admin's permissions on deliveries: view to read, change to replay (the
    same rule as the admin's actions)."""

    def has_permission(self, request, view) -> bool:
        action = "view" if request.method in SAFE_METHODS else "change"
        return super().has_permission(request, view) and request.user.has_perm(
            f"webhooks.{action}_delivery"
        )


class StaffView(APIView):
    authentication_classes = [TokenAuthentication]
    permission_classes = [DeliveryPermission]


class Pages(CursorPagination):
    ordering = "-id"
    page_size = 100


def _queryset(params):
    """The list's filters, parsed (a bad value is a 400), for `selectors.delivery_list`."""
    state = params.get("state")
    if state is not None and state not in DeliveryState.values:
        raise serializers.ValidationError({"state": f"one of {', '.join(DeliveryState.values)}"})
    task_id = None
    if "task" in params:
        try:
            task_id = uuid.UUID(params["task"])
        except ValueError:
            raise serializers.ValidationError({"task": "not a task id"}) from None
    return selectors.delivery_list(
        state=state,
        task_id=task_id,
        agent_slug=_text(params, "agent") if "agent" in params else None,
        endpoint_origin=_text(params, "endpoint") if "endpoint" in params else None,
    )


def _text(params, name: str) -> str:
    """A free-text filter; PostgreSQL refuses NUL in text, so it is a 400 here, not a 500."""
    if "\x00" in params[name]:
        raise serializers.ValidationError({name: "must not contain NUL characters (U+0000)"})
    return params[name]


class DeliveryList(StaffView):
    def get(self, request):
        paginator = Pages()
        page = paginator.paginate_queryset(_queryset(request.query_params), request, view=self)
        return paginator.get_paginated_response(DeliverySerializer(page, many=True).data)


class DeliveryDetail(StaffView):
    def get(self, request, event_id):
        delivery = selectors.delivery_by_event_id(event_id)
        if delivery is None:
            return Response({"error": {"code": "not_found"}}, status=status.HTTP_404_NOT_FOUND)
        return Response(DeliveryDetailSerializer(delivery).data)


class ReplaySerializer(serializers.Serializer):
    ids = serializers.ListField(child=serializers.UUIDField(), min_length=1, max_length=1000)


class DeliveryReplay(StaffView):
    """Re-open dead-lettered or delivered deliveries (audited). Others are left as they are."""

    def post(self, request):
        data = ReplaySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pks = selectors.delivery_pks(data.validated_data["ids"])
        count = delivery_replay(delivery_pks=pks, actor=f"api:{request.user.get_username()}")
        return Response({"replayed": count, "requested": len(data.validated_data["ids"])})
