"""Rebind API for integrators (staff token; docs/rebinds.md): preview, start (now or at a
time), list, read with live counts and the tasks still on the old version, and every
transition. Thin: each view calls one service of webhooks/rebind.py, the same ones the admin
console and the `rebind` command call.

Permissions are the admin's: `webhooks.view_rebind` to read, `webhooks.run_rebind` to start,
preview or change one. Errors: 400 `invalid` (with the field), 404 `not_found`, 409
`conflict` (an open rebind over the same scope, named) or `illegal_transition`.
"""

from __future__ import annotations

from rest_framework import serializers, status
from rest_framework.authentication import TokenAuthentication
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import SAFE_METHODS, IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView

from agents.models import Agent, OnDrainTimeout, PushChannelPolicy
from webhooks import rebind as rebinds
from webhooks.errors import RebindConflict, RebindInvalid, RebindNotFound
from webhooks.models import PushConfig, Rebind, RebindState
from webhooks.rebind_checks import RebindPreview, RebindRequest, rebind_preview
from webhooks.rebind_machine import IllegalRebindTransition
from webhooks.selectors import rebind_stragglers


class RebindPermission(IsAdminUser):
    def has_permission(self, request, view) -> bool:
        perm = "webhooks.view_rebind" if request.method in SAFE_METHODS else "webhooks.run_rebind"
        return super().has_permission(request, view) and request.user.has_perm(perm)


class RebindView(APIView):
    authentication_classes = [TokenAuthentication]
    permission_classes = [RebindPermission]

    def handle_exception(self, exc):
        if isinstance(exc, RebindInvalid):
            body = {"code": "invalid", "field": exc.field, "message": exc.description}
            return Response({"error": body}, status=status.HTTP_400_BAD_REQUEST)
        if isinstance(exc, RebindNotFound):
            body = {"code": "not_found", "message": str(exc)}
            return Response({"error": body}, status=status.HTTP_404_NOT_FOUND)
        if isinstance(exc, RebindConflict):
            body = {"code": "conflict", "rebind": str(exc.other_pk), "message": str(exc)}
            return Response({"error": body}, status=status.HTTP_409_CONFLICT)
        if isinstance(exc, IllegalRebindTransition):
            body = {"code": "illegal_transition", "state": exc.state, "message": str(exc)}
            return Response({"error": body}, status=status.HTTP_409_CONFLICT)
        return super().handle_exception(exc)

    @property
    def actor(self) -> str:
        return f"api:{self.request.user.get_username()}"


class RebindSerializer(serializers.ModelSerializer):
    agent = serializers.CharField(source="agent.slug")

    class Meta:
        model = Rebind
        fields = [
            "id",
            "agent",
            "state",
            "policy",
            "rotate_key",
            "move_from",
            "move_to",
            "move_origin",
            "finish_on_old",
            "deadline_seconds",
            "deadline",
            "on_timeout",
            "extended_at",
            "actor",
            "reason",
            "forced",
            "scheduled_for",
            "created_at",
            "started_at",
            "finished_at",
            "old_key_retire_after",
            "counts",
        ]


class MovePrefix(serializers.Serializer):
    old = serializers.CharField(max_length=2048)
    new = serializers.CharField(max_length=2048)
    origin = serializers.CharField(max_length=300, required=False, default="")


class OneConfig(serializers.Serializer):
    taskId = serializers.UUIDField()
    configId = serializers.CharField(max_length=255)
    url = serializers.CharField(max_length=2048, required=False, default="")
    token = serializers.CharField(max_length=1024, required=False, allow_blank=True, default=None)
    authScheme = serializers.CharField(max_length=64, required=False, default=None)
    credentials = serializers.CharField(max_length=4096, required=False, default="")


class StartSerializer(serializers.Serializer):
    agent = serializers.SlugField(max_length=64)
    rotateKey = serializers.BooleanField(default=False)
    movePrefix = MovePrefix(required=False)
    config = OneConfig(required=False)
    policy = serializers.ChoiceField(choices=PushChannelPolicy.values, required=False)
    finishOnOld = serializers.BooleanField(default=False)
    deadlineSeconds = serializers.IntegerField(required=False)
    onTimeout = serializers.ChoiceField(choices=OnDrainTimeout.values, required=False)
    at = serializers.DateTimeField(required=False)
    reason = serializers.CharField(max_length=500, required=False, default="")
    force = serializers.BooleanField(default=False)
    preview = serializers.BooleanField(default=False, help_text="check and measure, write nothing")

    def rebind_request(self) -> RebindRequest:
        data = self.validated_data
        agent = Agent.objects.filter(slug=data["agent"]).first()
        if agent is None:
            raise RebindInvalid("agent", f"no agent {data['agent']!r}")
        move = data.get("movePrefix") or {}
        one = data.get("config")
        config = None
        if one is not None:
            config = PushConfig.objects.filter(
                task_id=one["taskId"], task__agent=agent, config_id=one["configId"]
            ).first()
            if config is None:
                raise RebindInvalid("config", f"agent {agent.slug!r} has no such config")
        return RebindRequest(
            agent=agent,
            rotate_key=data["rotateKey"],
            move_from=move.get("old", ""),
            move_to=move.get("new", ""),
            move_origin=move.get("origin", ""),
            config=config,
            new_url=one["url"] if one else "",
            new_token=one["token"] if one else None,
            new_auth_scheme=one["authScheme"] if one else None,
            new_credentials=one["credentials"] if one else "",
            policy=data.get("policy"),
            finish_on_old=data["finishOnOld"],
            deadline_seconds=data.get("deadlineSeconds"),
            on_timeout=data.get("onTimeout"),
            at=data.get("at"),
            reason=data["reason"],
            force=data["force"],
        )


class Pages(CursorPagination):
    ordering = "-created_at"
    page_size = 50


class RebindList(RebindView):
    def get(self, request):
        query = Rebind.objects.select_related("agent")
        state = request.query_params.get("state")
        if state is not None:
            if state not in RebindState.values:
                raise RebindInvalid("state", f"one of {', '.join(RebindState.values)}")
            query = query.filter(state=state)
        if "agent" in request.query_params:
            query = query.filter(agent__slug=request.query_params["agent"].replace("\x00", ""))
        paginator = Pages()
        page = paginator.paginate_queryset(query, request, view=self)
        return paginator.get_paginated_response(RebindSerializer(page, many=True).data)

    def post(self, request):
        body = StartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        req = body.rebind_request()
        if body.validated_data["preview"]:
            return Response(_preview_json(rebind_preview(req)))
        rebind = rebinds.rebind_start(req, actor=self.actor)
        return Response(RebindSerializer(rebind).data, status=status.HTTP_201_CREATED)


def _preview_json(preview: RebindPreview) -> dict:
    return {
        "policy": preview.policy,
        "deadlineSeconds": preview.deadline_seconds,
        "onTimeout": preview.on_timeout,
        "overlapSeconds": preview.overlap_seconds,
        "conflict": (
            {"rebind": str(preview.conflict.other_pk), "message": str(preview.conflict)}
            if preview.conflict
            else None
        ),
        "configs": preview.configs,
        "inFlight": preview.in_flight,
        "inFlightByState": preview.in_flight_by_state,
        "endpoints": preview.endpoints,
        "tasks": preview.tasks,
    }


class RebindDetail(RebindView):
    def get(self, request, pk):
        rebind = rebinds.rebind_get(pk)
        return Response(
            {**RebindSerializer(rebind).data, "onOldVersion": rebind_stragglers(rebind, 500)}
        )


class MovesSerializer(serializers.Serializer):
    moves = serializers.ListField(child=serializers.IntegerField(), min_length=1, max_length=5000)


class ExtendSerializer(serializers.Serializer):
    seconds = serializers.IntegerField(min_value=1)


class RebindAction(RebindView):
    """POST /api/v1/rebinds/<id>/<action>: advance, cutover, extend, abort, rebind-orphans,
    move-now, finish-on-old."""

    def post(self, request, pk, action):
        rebind = rebinds.rebind_get(pk)
        if action == "advance":
            rebind = rebinds.rebind_advance(rebind.pk)
        elif action == "cutover":
            rebind = rebinds.rebind_cutover(rebind.pk, actor=self.actor)
        elif action == "abort":
            reason = str(request.data.get("reason", ""))[:500]
            rebind = rebinds.rebind_abort(rebind.pk, actor=self.actor, reason=reason)
        elif action == "extend":
            body = ExtendSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            seconds = body.validated_data["seconds"]
            rebind = rebinds.rebind_extend(rebind.pk, seconds=seconds, actor=self.actor)
        elif action == "rebind-orphans":
            count = rebinds.rebind_orphans(rebind.pk, actor=self.actor)
            return Response({"rebound": count})
        elif action in ("move-now", "finish-on-old"):
            body = MovesSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            step = (
                rebinds.rebind_moves_now
                if action == "move-now"
                else rebinds.rebind_moves_finish_on_old
            )
            count = step(rebind.pk, move_pks=body.validated_data["moves"], actor=self.actor)
            return Response({"changed": count})
        else:
            body = {"code": "not_found", "message": f"no action {action!r}"}
            return Response({"error": body}, status=status.HTTP_404_NOT_FOUND)
        return Response(RebindSerializer(rebind).data)
