"""`/api/v1/rebinds/` (docs/rebinds.md): preview, start (now or at a time; Idempotency-Key),
list (filters: state, agent), read with live counts and the tasks still on the old version,
and every transition. Thin: each view calls one service of webhooks/rebinds/operations.py, the same
ones the admin console and the `rebind` command call.

Permissions are the admin's: `webhooks.view_rebind` to read, `webhooks.run_rebind` to start,
preview or change one. Errors (a2a_platform/api/errors.py): 400 `invalid_request` (with the
field), 404 `not_found`, 409 `rebind_conflict` (an open rebind over the same scope, named) or
`illegal_transition`.
"""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from a2a_platform.api.resources import uuid_param, uuid_path
from a2a_platform.api.views import ApiListView, ApiView
from agents.models import Agent, OnDrainTimeout, PushChannelPolicy
from tasks.api.serializers import WireModelSerializer, WireSerializer
from tasks.states import TaskState
from webhooks.errors import RebindInvalid
from webhooks.models import DeliveryState, MoveState, Rebind, RebindState
from webhooks.rebinds import operations as rebinds
from webhooks.rebinds.checks import (
    FAILED,
    FORCED,
    NOT_NEEDED,
    PASSED,
    RebindPreview,
    RebindRequest,
    rebind_preview,
)
from webhooks.selectors import agent_push_config, rebind_stragglers


class RebindView(ApiView):
    read_perm = "webhooks.view_rebind"
    write_perm = "webhooks.run_rebind"


# A task state's short name (working, input-required, ...), as the counts and lists key them.
SHORT_STATES = sorted(s.short for s in TaskState)


class NoticeCountsSerializer(WireSerializer):
    delivered = serializers.IntegerField()
    pending = serializers.IntegerField(help_text="pending or being sent")
    dead = serializers.IntegerField()
    superseded = serializers.IntegerField(help_text="superseded or canceled")


class RebindCountsSerializer(WireSerializer):
    """A rebind's counts (webhooks.selectors.rebind_counts), as the monitor last stored them
    (empty before its first pass)."""

    onOldVersion = serializers.DictField(
        child=serializers.IntegerField(),
        required=False,
        help_text="tasks still on the old version, by task state (working, ...)",
    )
    onOldVersionTotal = serializers.IntegerField(required=False)
    moved = serializers.IntegerField(required=False)
    finishedOnOld = serializers.IntegerField(required=False)
    finishingOnOld = serializers.IntegerField(required=False)
    noticePending = serializers.IntegerField(required=False)
    orphaned = serializers.IntegerField(required=False)
    rebound = serializers.IntegerField(required=False)
    reverted = serializers.IntegerField(required=False)
    notices = NoticeCountsSerializer(required=False, help_text="its notices by delivery state")


class RebindSerializer(WireModelSerializer):
    agent = serializers.CharField(source="agent.slug")
    counts = RebindCountsSerializer(read_only=True)

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


class MovePrefix(WireSerializer):
    old = serializers.CharField(max_length=2048)
    new = serializers.CharField(max_length=2048)
    origin = serializers.CharField(max_length=300, required=False, default="", allow_blank=True)


class OneConfig(WireSerializer):
    taskId = serializers.UUIDField()
    configId = serializers.CharField(max_length=255)
    url = serializers.CharField(max_length=2048, required=False, default="", allow_blank=True)
    token = serializers.CharField(max_length=1024, required=False, allow_blank=True, default=None)
    authScheme = serializers.CharField(max_length=64, required=False, default=None)
    credentials = serializers.CharField(
        max_length=4096, required=False, default="", allow_blank=True
    )


class StartSerializer(WireSerializer):
    agent = serializers.SlugField(max_length=64)
    rotateKey = serializers.BooleanField(default=False)
    movePrefix = MovePrefix(required=False)
    config = OneConfig(required=False)
    policy = serializers.ChoiceField(choices=PushChannelPolicy.values, required=False)
    finishOnOld = serializers.BooleanField(default=False)
    deadlineSeconds = serializers.IntegerField(required=False)
    onTimeout = serializers.ChoiceField(choices=OnDrainTimeout.values, required=False)
    at = serializers.DateTimeField(required=False)
    reason = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)
    force = serializers.BooleanField(default=False)
    preview = serializers.BooleanField(default=False, help_text="check and measure, write nothing")

    def rebind_request(self) -> RebindRequest:
        data = self.validated_data
        agent = Agent.objects.filter(slug=data["agent"]).first()
        if agent is None:
            raise RebindInvalid("agent", f"no agent {data['agent']!r}")
        move = data.get("movePrefix") or {}
        one = data.get("config")
        config = (
            agent_push_config(agent, one["taskId"], one["configId"]) if one is not None else None
        )
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


class ConflictSerializer(WireSerializer):
    rebind = serializers.UUIDField(help_text="the open rebind over the same scope")
    message = serializers.CharField()


class ScopedTaskSerializer(WireSerializer):
    task = serializers.UUIDField()
    state = serializers.ChoiceField(choices=SHORT_STATES)
    config = serializers.CharField(help_text="the config id")


class PreCheckSerializer(WireSerializer):
    check = serializers.CharField(help_text="what was checked")
    result = serializers.ChoiceField(choices=[PASSED, FAILED, FORCED, NOT_NEEDED])
    detail = serializers.CharField(help_text="why, in words")


class PreviewSerializer(WireSerializer):
    """What starting the rebind would do; nothing was written."""

    policy = serializers.ChoiceField(choices=PushChannelPolicy.choices)
    deadlineSeconds = serializers.IntegerField()
    onTimeout = serializers.ChoiceField(choices=OnDrainTimeout.choices)
    overlapSeconds = serializers.IntegerField(
        help_text="how long the next key is published before it signs (0: no rotation)"
    )
    conflict = ConflictSerializer(allow_null=True)
    configs = serializers.IntegerField(help_text="push configs in the rebind's scope")
    inFlight = serializers.IntegerField(help_text="of which on tasks not finished")
    inFlightByState = serializers.DictField(child=serializers.IntegerField())
    endpoints = serializers.ListField(child=serializers.CharField(), help_text="origins")
    tasks = ScopedTaskSerializer(many=True, help_text="the first in-flight tasks")
    checks = PreCheckSerializer(many=True)


class StragglerSerializer(WireSerializer):
    """A task still on the old version (webhooks.selectors.rebind_stragglers)."""

    task = serializers.UUIDField()
    state = serializers.ChoiceField(choices=SHORT_STATES)
    config = serializers.CharField(help_text="the config id")
    version = serializers.CharField(help_text="<configId>.v<version>, the old channel")
    move = serializers.ChoiceField(choices=MoveState.choices)
    notice = serializers.ChoiceField(
        choices=DeliveryState.choices, allow_null=True, help_text="its notice's delivery state"
    )
    noticeError = serializers.CharField(allow_blank=True)
    since = serializers.DateTimeField()


class RebindDetailSerializer(RebindSerializer):
    onOldVersion = StragglerSerializer(many=True, read_only=True, help_text="the first 500")

    class Meta(RebindSerializer.Meta):
        fields = [*RebindSerializer.Meta.fields, "onOldVersion"]


class RebindFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=RebindState.choices)
    agent = django_filters.CharFilter(field_name="agent__slug", max_length=64)

    class Meta:
        model = Rebind
        fields = ["state", "agent"]


class RebindList(RebindView, ApiListView):
    serializer_class = RebindSerializer
    filterset_class = RebindFilter
    ordering = "-created_at"
    ordering_fields = ["created_at"]
    idempotent = True

    def get_queryset(self):
        return Rebind.objects.select_related("agent")

    @extend_schema(
        request=StartSerializer,
        responses={201: RebindSerializer, 200: PreviewSerializer},
        description="Start a rebind (201), or with `preview: true` check and measure it (200, "
        "nothing written).",
    )
    def post(self, request):
        body = StartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        req = body.rebind_request()
        if body.validated_data["preview"]:
            return Response(PreviewSerializer(_preview_json(rebind_preview(req))).data)
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
        # The pre-checks as the console's confirmation lists them (result: passed, failed,
        # forced or not needed).
        "checks": [
            {"check": c.check, "result": c.result, "detail": c.detail} for c in preview.checks
        ],
    }


REBIND_ID = uuid_path("id")


def rebind_or_404(pk: str):
    return rebinds.rebind_get(uuid_param("rebindId", pk))


@extend_schema(parameters=[REBIND_ID])
class RebindDetail(RebindView):
    serializer_class = RebindDetailSerializer

    def get(self, request, pk):
        rebind = rebind_or_404(pk)
        rebind.onOldVersion = rebind_stragglers(rebind, 500)
        return Response(RebindDetailSerializer(rebind).data)


class MovesSerializer(WireSerializer):
    moves = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        min_length=1,
        max_length=5000,
    )


class AbortSerializer(WireSerializer):
    # Parsed only: an empty reason is the service's refusal (400 on `reason`, its words).
    reason = serializers.CharField(
        max_length=500,
        required=False,
        default="",
        allow_blank=True,
        help_text="why: an abort without one is refused",
    )


class ExtendSerializer(WireSerializer):
    seconds = serializers.IntegerField(min_value=1, max_value=2**31 - 1)


class CountSerializer(WireSerializer):
    rebound = serializers.IntegerField(required=False, help_text="rebind-orphans: configs re-bound")
    changed = serializers.IntegerField(required=False, help_text="move-now / finish-on-old")


class RebindAction(RebindView):
    """POST /api/v1/rebinds/<id>/<action>: one view per transition (advance, cutover, extend,
    abort, rebind-orphans, move-now, finish-on-old), each documented with its own body."""

    serializer_class = RebindSerializer
    body: type[serializers.Serializer] | None = None

    def parsed(self, request) -> dict:
        if self.body is None:
            return {}
        body = self.body(data=request.data)
        body.is_valid(raise_exception=True)
        return body.validated_data

    @extend_schema(parameters=[REBIND_ID])
    def post(self, request, pk):
        rebind = rebind_or_404(pk)
        return self.run(rebind, self.parsed(request))

    def run(self, rebind, data: dict) -> Response:
        raise NotImplementedError


@extend_schema(request=None, responses={200: RebindSerializer})
class RebindAdvance(RebindAction):
    def run(self, rebind, data):
        return Response(RebindSerializer(rebinds.rebind_advance(rebind.pk)).data)


@extend_schema(request=None, responses={200: RebindSerializer})
class RebindCutover(RebindAction):
    def run(self, rebind, data):
        done = rebinds.rebind_cutover(rebind.pk, actor=self.actor)
        return Response(RebindSerializer(done).data)


@extend_schema(request=AbortSerializer, responses={200: RebindSerializer})
class RebindAbort(RebindAction):
    body = AbortSerializer

    def run(self, rebind, data):
        done = rebinds.rebind_abort(rebind.pk, actor=self.actor, reason=data["reason"])
        return Response(RebindSerializer(done).data)


@extend_schema(request=ExtendSerializer, responses={200: RebindSerializer})
class RebindExtend(RebindAction):
    body = ExtendSerializer

    def run(self, rebind, data):
        done = rebinds.rebind_extend(rebind.pk, seconds=data["seconds"], actor=self.actor)
        return Response(RebindSerializer(done).data)


@extend_schema(request=None, responses={200: CountSerializer})
class RebindOrphans(RebindAction):
    def run(self, rebind, data):
        return Response({"rebound": rebinds.rebind_orphans(rebind.pk, actor=self.actor)})


@extend_schema(request=MovesSerializer, responses={200: CountSerializer})
class RebindMoveNow(RebindAction):
    body = MovesSerializer

    def run(self, rebind, data):
        count = rebinds.rebind_moves_now(rebind.pk, move_pks=data["moves"], actor=self.actor)
        return Response({"changed": count})


@extend_schema(request=MovesSerializer, responses={200: CountSerializer})
class RebindFinishOnOld(RebindAction):
    body = MovesSerializer

    def run(self, rebind, data):
        step = rebinds.rebind_moves_finish_on_old
        return Response({"changed": step(rebind.pk, move_pks=data["moves"], actor=self.actor)})


ACTIONS: dict[str, type[RebindAction]] = {
    "advance": RebindAdvance,
    "cutover": RebindCutover,
    "extend": RebindExtend,
    "abort": RebindAbort,
    "rebind-orphans": RebindOrphans,
    "move-now": RebindMoveNow,
    "finish-on-old": RebindFinishOnOld,
}
