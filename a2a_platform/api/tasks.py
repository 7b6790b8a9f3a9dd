"""`/api/v1/tasks/`: every agent's tasks, whoever owns them (operators read what the admin
shows). List with filters (agent, state, contextId, orphaned, updatedSince), ordering and
cursor pages; read one with its history, artifacts and push channel history (binding
versions, rebind moves, notices; credentials masked). Reads only: a task changes through the
A2A protocol, never here. Permission `tasks.view_task` (read scope).
"""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from a2a_platform.api.errors import not_found
from a2a_platform.api.filters import UtcDateTimeFilter
from a2a_platform.api.resources import (
    TASK_ID,
    ResourceMethods,
    StrictBooleanFilter,
    task_id_param,
)
from a2a_platform.api.views import ApiListView, ApiView
from tasks import selectors, wire
from tasks.models import Task
from tasks.states import TaskState
from webhooks.selectors import task_channel_history

# `?state=` takes the wire name (TASK_STATE_WORKING) or its short form (working).
_STATES = {s.value: s.value for s in TaskState} | {s.short: s.value for s in TaskState}


class TaskFilter(django_filters.FilterSet):
    """The list's filters, parsed here (a bad value is a 400 naming the filter) and applied
    by `tasks.selectors.task_list`, the one reading of them."""

    agent = django_filters.CharFilter(max_length=64, help_text="the agent's slug")
    state = django_filters.ChoiceFilter(
        choices=[(name, name) for name in sorted(_STATES)],
        help_text="a task state: TASK_STATE_WORKING or working",
    )
    contextId = django_filters.CharFilter(max_length=255, help_text="the A2A contextId")
    orphaned = StrictBooleanFilter(
        help_text="true: a rebind's cutover orphaned one of its push channels (not re-bound)"
    )
    updatedSince = UtcDateTimeFilter(
        help_text="an event (status, artifact, message) was written at or after this time"
    )

    class Meta:
        model = Task
        fields: list[str] = []

    def filter_queryset(self, queryset):
        data = self.form.cleaned_data
        state = data.get("state") or None
        return selectors.task_list(
            agent_slug=data.get("agent") or None,
            state=_STATES[state] if state else None,
            context_id=data.get("contextId") or None,
            orphaned=data.get("orphaned"),
            updated_since=data.get("updatedSince"),
        )


class TaskSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    agent = serializers.CharField(source="agent.slug")
    owner = serializers.CharField(help_text="the principal that opened it")
    contextId = serializers.CharField(source="context_id")
    state = serializers.CharField()
    statusTimestamp = serializers.DateTimeField(source="status_timestamp")
    lastSeq = serializers.IntegerField(source="last_seq", help_text="its last event's seq")
    orphaned = serializers.BooleanField()
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class MaskedAuthSerializer(serializers.Serializer):
    scheme = serializers.CharField()
    credentials = serializers.CharField(allow_null=True, help_text='"set" or null, never shown')


class BindingVersionSerializer(serializers.Serializer):
    """One immutable version of a push config (webhooks.models.PushBinding)."""

    configId = serializers.CharField()
    version = serializers.IntegerField()
    channel = serializers.CharField(help_text="<configId>.v<version>, as X-A2A-Binding-Version")
    status = serializers.ChoiceField(choices=["active", "waiting", "retired", "retired_unused"])
    url = serializers.CharField()
    endpoint = serializers.CharField(help_text="the receiver origin")
    token = serializers.CharField(allow_null=True, help_text='"set" or null, never shown')
    authentication = MaskedAuthSerializer(allow_null=True)
    createdAt = serializers.DateTimeField()
    activatedAt = serializers.DateTimeField(allow_null=True)
    retiredAt = serializers.DateTimeField(allow_null=True)


class MoveSerializer(serializers.Serializer):
    """One config's move in a rebind (webhooks.models.ChannelMove)."""

    rebindId = serializers.UUIDField()
    rebindState = serializers.CharField()
    configId = serializers.CharField()
    fromVersion = serializers.IntegerField(allow_null=True)
    toVersion = serializers.IntegerField(allow_null=True)
    state = serializers.CharField(help_text="notice_pending, moved, orphaned, rebound, ...")
    fromSeq = serializers.IntegerField()
    notice = serializers.UUIDField(allow_null=True, help_text="its notice's delivery id")
    createdAt = serializers.DateTimeField()
    finishedAt = serializers.DateTimeField(allow_null=True)


class NoticeSerializer(serializers.Serializer):
    """A channel notice delivered on an old version (a delivery of kind `notice`)."""

    id = serializers.UUIDField(help_text="the delivery's id (webhook-id)")
    kind = serializers.CharField(help_text="channel-changed or channel-orphaned")
    configId = serializers.CharField(allow_null=True)
    version = serializers.IntegerField(allow_null=True, help_text="the version it went to")
    state = serializers.CharField()
    attempts = serializers.IntegerField()
    lastError = serializers.CharField(allow_blank=True)
    createdAt = serializers.DateTimeField()
    finishedAt = serializers.DateTimeField(allow_null=True)


class ChannelHistorySerializer(serializers.Serializer):
    versions = BindingVersionSerializer(many=True)
    moves = MoveSerializer(many=True)
    notices = NoticeSerializer(many=True)


class TaskDetailSerializer(TaskSerializer):
    status = serializers.JSONField(help_text="the A2A TaskStatus")
    metadata = serializers.JSONField()
    history = serializers.ListField(child=serializers.JSONField(), help_text="A2A Messages")
    artifacts = serializers.ListField(child=serializers.JSONField(), help_text="A2A Artifacts")
    channelHistory = ChannelHistorySerializer(help_text="its push channels over time")


class TaskView(ResourceMethods, ApiView):
    read_perm = "tasks.view_task"


class TaskList(ApiListView, TaskView):
    """Tasks of every agent and owner, most recently updated first (cursor pages)."""

    serializer_class = TaskSerializer
    filterset_class = TaskFilter
    ordering = ("-updated_at", "-id")
    ordering_fields = sorted({o.lstrip("-") for o in selectors.TASK_ORDERINGS})

    def get_queryset(self):
        return selectors.task_list()


class _TaskRead:
    """A task with what its read adds (status, history, artifacts, channel history)."""

    def __init__(self, task: Task, **extra: object) -> None:
        self._task = task
        self.__dict__.update(extra)

    def __getattr__(self, name: str) -> object:
        return getattr(self._task, name)


class TaskDetail(TaskView):
    serializer_class = TaskDetailSerializer

    @extend_schema(responses=TaskDetailSerializer, parameters=[TASK_ID])
    def get(self, request, task_id):
        task = selectors.task_read(task_id_param(task_id))
        if task is None:
            raise not_found(f"no task {task_id}")
        read = _TaskRead(
            task,
            status=wire.status_json(task),
            history=[wire.stored_message_json(m) for m in selectors.task_history(task, None)],
            artifacts=[wire.artifact_json(a) for a in selectors.task_artifacts(task)],
            channelHistory=task_channel_history(task),
        )
        return Response(TaskDetailSerializer(read).data)
