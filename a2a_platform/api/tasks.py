"""`/api/v1/tasks/`: every agent's tasks, whoever owns them (operators read what the admin
shows). List with filters (agent, state, contextId, orphaned, updatedSince), ordering and
cursor pages; read one with its history, artifacts and push channel history (binding
versions, rebind moves, notices; credentials masked). Reads only: a task changes through the
A2A protocol, never here. Permission `tasks.view_task` (read scope).
"""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema, extend_schema_field
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
from tasks.api.serializers import WireSerializer
from tasks.models import Task
from tasks.states import TaskState
from webhooks.models import DeliveryState, MoveState, RebindState
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


# The A2A objects a task's read carries (A2A v1.0 section 4.1, as tasks.wire writes them).
_OBJECT = {"type": "object", "additionalProperties": True}
_STRINGS = {"type": "array", "items": {"type": "string"}}
A2A_MESSAGE = {
    "type": "object",
    "properties": {
        "messageId": {"type": "string"},
        "contextId": {"type": "string"},
        "taskId": {"type": "string"},
        "role": {"type": "string", "enum": ["ROLE_USER", "ROLE_AGENT"]},
        "parts": {"type": "array", "items": _OBJECT},
        "metadata": _OBJECT,
        "extensions": _STRINGS,
        "referenceTaskIds": _STRINGS,
    },
    "required": ["messageId", "role", "parts"],
}
A2A_ARTIFACT = {
    "type": "object",
    "properties": {
        "artifactId": {"type": "string"},
        "name": {"type": "string"},
        "description": {"type": "string"},
        "parts": {"type": "array", "items": _OBJECT},
        "metadata": _OBJECT,
        "extensions": _STRINGS,
    },
    "required": ["artifactId", "parts"],
}
A2A_TASK_STATUS = {
    "type": "object",
    "properties": {
        "state": {"type": "string", "enum": [s.value for s in TaskState]},
        "timestamp": {"type": "string", "format": "date-time"},
        "message": {**A2A_MESSAGE, "description": "the status message, if any"},
    },
    "required": ["state", "timestamp"],
}


@extend_schema_field(A2A_TASK_STATUS)
class TaskStatusField(serializers.JSONField):
    pass


@extend_schema_field({"type": "array", "items": A2A_MESSAGE})
class MessagesField(serializers.JSONField):
    pass


@extend_schema_field({"type": "array", "items": A2A_ARTIFACT})
class ArtifactsField(serializers.JSONField):
    pass


class TaskSerializer(WireSerializer):
    id = serializers.UUIDField()
    agent = serializers.CharField(source="agent.slug")
    owner = serializers.CharField(help_text="the principal that opened it")
    contextId = serializers.CharField(source="context_id")
    state = serializers.ChoiceField(choices=[s.value for s in TaskState])
    statusTimestamp = serializers.DateTimeField(source="status_timestamp")
    lastSeq = serializers.IntegerField(source="last_seq", help_text="its last event's seq")
    orphaned = serializers.BooleanField()
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")


class MaskedAuthSerializer(WireSerializer):
    scheme = serializers.CharField()
    credentials = serializers.CharField(allow_null=True, help_text='"set" or null, never shown')


class BindingVersionSerializer(WireSerializer):
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


class MoveSerializer(WireSerializer):
    """One config's move in a rebind (webhooks.models.ChannelMove)."""

    rebindId = serializers.UUIDField()
    rebindState = serializers.ChoiceField(choices=RebindState.choices)
    configId = serializers.CharField()
    fromVersion = serializers.IntegerField(allow_null=True)
    toVersion = serializers.IntegerField(allow_null=True)
    state = serializers.ChoiceField(choices=MoveState.choices)
    fromSeq = serializers.IntegerField()
    notice = serializers.UUIDField(allow_null=True, help_text="its notice's delivery id")
    createdAt = serializers.DateTimeField()
    finishedAt = serializers.DateTimeField(allow_null=True)


class NoticeSerializer(WireSerializer):
    """A channel notice delivered on an old version (a delivery of kind `notice`)."""

    id = serializers.UUIDField(help_text="the delivery's id (webhook-id)")
    kind = serializers.ChoiceField(
        choices=["channel-changed", "channel-orphaned", ""], help_text='"": an unreadable body'
    )
    configId = serializers.CharField(allow_null=True)
    version = serializers.IntegerField(allow_null=True, help_text="the version it went to")
    state = serializers.ChoiceField(choices=DeliveryState.choices)
    attempts = serializers.IntegerField()
    lastError = serializers.CharField(allow_blank=True)
    createdAt = serializers.DateTimeField()
    finishedAt = serializers.DateTimeField(allow_null=True)


class ChannelHistorySerializer(WireSerializer):
    versions = BindingVersionSerializer(many=True)
    moves = MoveSerializer(many=True)
    notices = NoticeSerializer(many=True)


class TaskDetailSerializer(TaskSerializer):
    status = TaskStatusField(help_text="the A2A TaskStatus")
    metadata = serializers.DictField()
    history = MessagesField(help_text="A2A Messages")
    artifacts = ArtifactsField(help_text="A2A Artifacts")
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
