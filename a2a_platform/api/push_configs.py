"""`/api/v1/tasks/<taskId>/push-configs/`: a task's push configs (deleted ones too) with
every binding version they went through, credentials masked (whether a token or credentials
are set and the scheme, never the secret). Reads only: a client registers and deletes its
configs through the A2A protocol (the push-registration gate), and an operator changes one
through a rebind of that config (`/api/v1/rebinds/`, docs/rebinds.md). Permission
`webhooks.view_pushconfig` (read scope).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from a2a_platform.api.errors import invalid, not_found
from a2a_platform.api.resources import CONFIG_ID, TASK_ID, ResourceMethods, task_id_param
from a2a_platform.api.tasks import BindingVersionSerializer
from a2a_platform.api.views import ApiView
from tasks import selectors as task_selectors
from tasks.api.serializers import WireSerializer
from webhooks import selectors
from webhooks.models import CONFIG_ID as CONFIG_ID_PATTERN
from webhooks.models import PushConfig


class PushConfigSerializer(WireSerializer):
    id = serializers.CharField(help_text="the client's config id")
    taskId = serializers.UUIDField()
    currentVersion = serializers.IntegerField()
    deleted = serializers.BooleanField()
    deletedAt = serializers.DateTimeField(allow_null=True)
    createdAt = serializers.DateTimeField()
    versions = BindingVersionSerializer(many=True)


class PushConfigListSerializer(WireSerializer):
    results = PushConfigSerializer(many=True)


def config_json(config: PushConfig) -> dict:
    return {
        "id": config.config_id,
        "taskId": config.task_id,
        "currentVersion": config.current_version,
        "deleted": config.deleted_at is not None,
        "deletedAt": config.deleted_at,
        "createdAt": config.created_at,
        "versions": [selectors.binding_version(config, b) for b in config.bindings.all()],
    }


class PushConfigView(ResourceMethods, ApiView):
    read_perm = "webhooks.view_pushconfig"

    def task(self, task_id: str):
        task = task_selectors.task_read(task_id_param(task_id))
        if task is None:
            raise not_found(f"no task {task_id}")
        return task


class PushConfigList(PushConfigView):
    """A task's push configs by id (a task has a bounded number: one page)."""

    serializer_class = PushConfigListSerializer
    pagination_class = None

    @extend_schema(
        responses=PushConfigListSerializer,
        operation_id="tasks_push_configs_list",
        parameters=[TASK_ID],
    )
    def get(self, request, task_id):
        configs = selectors.task_push_configs(self.task(task_id))
        return Response(PushConfigListSerializer({"results": map(config_json, configs)}).data)


class PushConfigDetail(PushConfigView):
    serializer_class = PushConfigSerializer

    @extend_schema(responses=PushConfigSerializer, parameters=[TASK_ID, CONFIG_ID])
    def get(self, request, task_id, config_id):
        task = self.task(task_id)
        if not CONFIG_ID_PATTERN.fullmatch(config_id):
            raise invalid("configId", "a config id is 1 to 255 URL-unreserved characters")
        config = selectors.task_push_config(task, config_id)
        if config is None:
            raise not_found(f"task {task.pk} has no push config {config_id}")
        return Response(PushConfigSerializer(config_json(config)).data)
