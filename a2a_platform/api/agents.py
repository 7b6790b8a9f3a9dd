"""`/api/v1/agents/`: agents (list, create, read, update: the card's fields, the capability
switches, the push rebind policy), their A2A API keys (list, create with the secret once,
revoke) and their signing keys (public parts; rotate = a key-rotation rebind, as the admin
and `manage.py rebind start --rotate-key` do). Every write is an agents or webhooks service.

Permissions: the agents app's (`view_agent`, `add_agent`, `change_agent`, `view_apikey`,
`add_apikey`, `change_apikey`, `view_signingkey`) and `webhooks.run_rebind` to rotate."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.response import Response

from a2a_platform.api import selectors
from a2a_platform.api.errors import invalid, not_found
from a2a_platform.api.rebinds import RebindSerializer
from a2a_platform.api.resources import StrictBooleanFilter, uuid_param, uuid_path
from a2a_platform.api.views import ApiListView, ApiView
from agents import executor_spec, readiness
from agents.models import (
    Agent,
    AnonymousListing,
    ApiKey,
    ApiKeyKind,
    AuthMode,
    OnDrainTimeout,
    PushChannelPolicy,
    SigningKey,
)
from agents.services import agent_create, agent_update, api_key_create, api_key_revoke
from agents.signing import public_jwk
from tasks.api.serializers import WireModelSerializer, WireSerializer
from webhooks.rebinds import operations as rebinds
from webhooks.rebinds.checks import RebindRequest

# API name -> model field, for the fields an operator edits (agents.services.EDITABLE_FIELDS).
FIELDS = {
    "name": "name",
    "description": "description",
    "version": "version",
    "providerOrganization": "provider_organization",
    "providerUrl": "provider_url",
    "documentationUrl": "documentation_url",
    "skills": "skills",
    "defaultInputModes": "default_input_modes",
    "defaultOutputModes": "default_output_modes",
    "extensions": "extensions",
    "pushNotificationsEnabled": "push_notifications_enabled",
    "streamingEnabled": "streaming_enabled",
    "cardMaxAge": "card_max_age",
    "pushRebindPolicy": "push_rebind_policy",
    "pushRebindDeadline": "push_rebind_deadline",
    "pushRebindOnTimeout": "push_rebind_on_timeout",
    "pushRebindMinOverlap": "push_rebind_min_overlap",
    "executor": "executor",
    "authMode": "auth_mode",
    "anonymousListTasks": "anonymous_list_tasks",
    "strictVersionHeader": "strict_version_header",
    "isDefault": "is_default",
    "enabled": "enabled",
}


# The A2A AgentSkill and AgentExtension (A2A v1.0 section 4.4), as the card's rendering
# (agents.services.agent_check, protobuf's JSON parser) takes them: no other member.
AGENT_SKILL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "name": {"type": "string"},
        "description": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "examples": {"type": "array", "items": {"type": "string"}},
        "inputModes": {"type": "array", "items": {"type": "string"}},
        "outputModes": {"type": "array", "items": {"type": "string"}},
        "securityRequirements": {"type": "array", "items": {"type": "object"}},
    },
    "additionalProperties": False,
}
AGENT_EXTENSION = {
    "type": "object",
    "properties": {
        "uri": {"type": "string"},
        "description": {"type": "string"},
        "required": {"type": "boolean"},
        "params": {"type": "object", "additionalProperties": True},
    },
    "additionalProperties": False,
}


@extend_schema_field({"type": "array", "items": AGENT_SKILL})
class SkillsField(serializers.ListField):
    child = serializers.DictField()


@extend_schema_field({"type": "array", "items": AGENT_EXTENSION})
class ExtensionsField(serializers.ListField):
    child = serializers.DictField()


class CapabilitySerializer(WireSerializer):
    on = serializers.BooleanField()
    reason = serializers.CharField(help_text="why it is on or off")


class CapabilitiesSerializer(WireSerializer):
    """What this instance honours for the agent right now (agents.readiness)."""

    pushNotifications = CapabilitySerializer()
    streaming = CapabilitySerializer()


class AgentSerializer(WireModelSerializer):
    """An agent as an operator sees it, with its capabilities right now (and why one is off:
    the rule of agents.readiness, the same the card and the admin show)."""

    providerOrganization = serializers.CharField(source="provider_organization")
    providerUrl = serializers.CharField(source="provider_url")
    documentationUrl = serializers.CharField(source="documentation_url")
    defaultInputModes = serializers.JSONField(source="default_input_modes")
    defaultOutputModes = serializers.JSONField(source="default_output_modes")
    pushNotificationsEnabled = serializers.BooleanField(source="push_notifications_enabled")
    streamingEnabled = serializers.BooleanField(source="streaming_enabled")
    cardMaxAge = serializers.IntegerField(source="card_max_age")
    pushRebindPolicy = serializers.ChoiceField(
        source="push_rebind_policy", choices=PushChannelPolicy.choices
    )
    pushRebindDeadline = serializers.IntegerField(source="push_rebind_deadline")
    pushRebindOnTimeout = serializers.ChoiceField(
        source="push_rebind_on_timeout", choices=OnDrainTimeout.choices
    )
    pushRebindMinOverlap = serializers.IntegerField(source="push_rebind_min_overlap")
    authMode = serializers.ChoiceField(source="auth_mode", choices=AuthMode.choices)
    anonymousListTasks = serializers.ChoiceField(
        source="anonymous_list_tasks", choices=AnonymousListing.choices
    )
    skills = SkillsField()
    extensions = ExtensionsField()
    strictVersionHeader = serializers.BooleanField(source="strict_version_header")
    isDefault = serializers.BooleanField(source="is_default")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")
    capabilities = serializers.SerializerMethodField()

    class Meta:
        model = Agent
        fields = ["slug", *FIELDS, "capabilities", "createdAt", "updatedAt"]

    @extend_schema_field(CapabilitiesSerializer)
    def get_capabilities(self, agent: Agent) -> dict:
        state = self.context.get("readiness") or readiness.current()
        caps = readiness.capabilities(agent, state)
        return {name: {"on": cap.on, "reason": cap.reason} for name, cap in caps.items()}


class AgentWriteSerializer(WireSerializer):
    """The editable fields; on create `slug`, `name` and `description` are required."""

    slug = serializers.SlugField(max_length=64, required=False)
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False)
    version = serializers.CharField(max_length=64, required=False)
    providerOrganization = serializers.CharField(max_length=200, required=False, allow_blank=True)
    providerUrl = serializers.URLField(required=False, allow_blank=True)
    documentationUrl = serializers.URLField(required=False, allow_blank=True)
    skills = SkillsField(required=False)
    defaultInputModes = serializers.ListField(
        child=serializers.CharField(max_length=200), required=False
    )
    defaultOutputModes = serializers.ListField(
        child=serializers.CharField(max_length=200), required=False
    )
    extensions = ExtensionsField(required=False)
    pushNotificationsEnabled = serializers.BooleanField(required=False)
    streamingEnabled = serializers.BooleanField(required=False)
    cardMaxAge = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False)
    pushRebindPolicy = serializers.ChoiceField(choices=PushChannelPolicy.choices, required=False)
    pushRebindDeadline = serializers.IntegerField(min_value=1, required=False)
    pushRebindOnTimeout = serializers.ChoiceField(choices=OnDrainTimeout.choices, required=False)
    pushRebindMinOverlap = serializers.IntegerField(
        min_value=0, max_value=2**31 - 1, required=False
    )
    # A built-in, `external`, or hosted code `python:<module>:<attribute>` (a 400 naming
    # `executor`, in the words of agents.executor_spec, for anything else).
    executor = serializers.CharField(
        max_length=executor_spec.MAX_LENGTH,
        validators=[executor_spec.validate_executor],
        required=False,
    )
    authMode = serializers.ChoiceField(choices=AuthMode.choices, required=False)
    anonymousListTasks = serializers.ChoiceField(choices=AnonymousListing.choices, required=False)
    strictVersionHeader = serializers.BooleanField(required=False)
    isDefault = serializers.BooleanField(required=False)
    enabled = serializers.BooleanField(required=False)

    def model_fields(self) -> dict:
        return {FIELDS[k]: v for k, v in self.validated_data.items() if k in FIELDS}


class AgentCreateSerializer(AgentWriteSerializer):
    slug = serializers.SlugField(max_length=64)
    name = serializers.CharField(max_length=200)
    description = serializers.CharField()


class AgentFilter(django_filters.FilterSet):
    # A built-in name or a hosted spec, exactly; anything else is a 400 naming the filter.
    executor = django_filters.CharFilter(validators=[executor_spec.validate_executor])
    enabled = StrictBooleanFilter()
    authMode = django_filters.ChoiceFilter(field_name="auth_mode", choices=AuthMode.choices)

    class Meta:
        model = Agent
        fields = ["executor", "enabled", "authMode"]


def agent_or_404(slug: str) -> Agent:
    # Any agent, enabled or not: the operator's list shows disabled ones, and one disabled
    # here must be readable and editable to be enabled again (agent_by_slug is what serves).
    agent = Agent.objects.filter(slug=slug).first()
    if agent is None:
        raise not_found(f"no agent {slug!r}")
    return agent


class AgentList(ApiListView):
    read_perm = "agents.view_agent"
    perms = {"POST": "agents.add_agent"}
    serializer_class = AgentSerializer
    filterset_class = AgentFilter
    ordering = "slug"
    ordering_fields = ["slug", "created_at", "updated_at"]
    idempotent = True

    def get_queryset(self):
        return Agent.objects.all()

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "readiness": readiness.current()}

    @extend_schema(request=AgentCreateSerializer, responses={201: AgentSerializer})
    def post(self, request):
        body = AgentCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = body.model_fields()
        agent = agent_create(slug=body.validated_data["slug"], actor=self.actor, **fields)
        return Response(AgentSerializer(agent).data, status=status.HTTP_201_CREATED)


class AgentDetail(ApiView):
    read_perm = "agents.view_agent"
    write_perm = "agents.change_agent"
    serializer_class = AgentSerializer

    def get(self, request, slug):
        return Response(AgentSerializer(agent_or_404(slug)).data)

    @extend_schema(request=AgentWriteSerializer, responses={200: AgentSerializer})
    def patch(self, request, slug):
        agent = agent_or_404(slug)
        body = AgentWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if "slug" in body.validated_data and body.validated_data["slug"] != agent.slug:
            raise invalid("slug", "an agent's slug cannot change (its URLs and clients)")
        agent = agent_update(agent_pk=agent.pk, changes=body.model_fields(), actor=self.actor)
        return Response(AgentSerializer(agent).data)


# --- A2A API keys ---------------------------------------------------------------------------


class ApiKeySerializer(WireModelSerializer):
    agent = serializers.CharField(source="agent.slug")
    createdAt = serializers.DateTimeField(source="created_at")
    lastUsedAt = serializers.DateTimeField(source="last_used_at", allow_null=True)
    revokedAt = serializers.DateTimeField(source="revoked_at", allow_null=True)

    class Meta:
        model = ApiKey
        fields = ["id", "agent", "kind", "name", "prefix", "createdAt", "lastUsedAt", "revokedAt"]


class NewApiKeySerializer(ApiKeySerializer):
    secret = serializers.CharField(
        allow_null=True,
        help_text="shown once, never again: null in an Idempotency-Key replay (never stored)",
    )

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "secret"]


class ApiKeyCreateSerializer(WireSerializer):
    name = serializers.CharField(max_length=200)
    kind = serializers.ChoiceField(choices=ApiKeyKind.choices, default=ApiKeyKind.CLIENT)


class ApiKeyFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=ApiKeyKind.choices)
    revoked = StrictBooleanFilter(field_name="revoked_at", lookup_expr="isnull", exclude=True)

    class Meta:
        model = ApiKey
        fields = ["kind", "revoked"]


class ApiKeyList(ApiListView):
    read_perm = "agents.view_apikey"
    perms = {"POST": "agents.add_apikey"}
    serializer_class = ApiKeySerializer
    filterset_class = ApiKeyFilter
    ordering = "-created_at"
    ordering_fields = ["created_at", "name"]
    idempotent = True

    def get_queryset(self):
        return selectors.agent_api_keys(self.kwargs.get("slug", ""))

    def get(self, request, slug):
        agent_or_404(slug)
        return super().get(request, slug)

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: NewApiKeySerializer})
    def post(self, request, slug):
        agent = agent_or_404(slug)
        body = ApiKeyCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        new = api_key_create(agent=agent, actor=self.actor, **body.validated_data)
        answer = {**ApiKeySerializer(new.key).data, "secret": new.token}
        return Response(answer, status=status.HTTP_201_CREATED)


class ApiKeyRevoke(ApiView):
    perms = {"POST": "agents.change_apikey"}
    serializer_class = ApiKeySerializer

    @extend_schema(
        request=None, responses={200: ApiKeySerializer}, parameters=[uuid_path("key_id")]
    )
    def post(self, request, slug, key_id):
        key_id = uuid_param("keyId", key_id)
        key = selectors.agent_api_keys(slug).filter(pk=key_id).first()
        if key is None:
            raise not_found(f"agent {slug!r} has no key {key_id}")
        return Response(ApiKeySerializer(api_key_revoke(key_id=key.pk, actor=self.actor)).data)


# --- signing keys ---------------------------------------------------------------------------


class SigningKeySerializer(WireModelSerializer):
    """Public parts only: never the private key, encrypted or not."""

    alg = serializers.CharField(source="algorithm")
    createdAt = serializers.DateTimeField(source="created_at")
    retiringSince = serializers.DateTimeField(source="retiring_since", allow_null=True)
    retiredAt = serializers.DateTimeField(source="retired_at", allow_null=True)
    jwk = serializers.SerializerMethodField()

    class Meta:
        model = SigningKey
        fields = ["kid", "alg", "state", "createdAt", "retiringSince", "retiredAt", "jwk"]

    def get_jwk(self, key: SigningKey) -> dict:
        return public_jwk(key)


class SigningKeyList(ApiListView):
    read_perm = "agents.view_signingkey"
    serializer_class = SigningKeySerializer
    ordering = "-created_at"
    ordering_fields = ["created_at"]

    def get_queryset(self):
        return selectors.agent_signing_keys(self.kwargs.get("slug", ""))

    def get(self, request, slug):
        agent_or_404(slug)
        return super().get(request, slug)


class RotateSerializer(WireSerializer):
    policy = serializers.ChoiceField(choices=PushChannelPolicy.choices, required=False)
    deadlineSeconds = serializers.IntegerField(required=False)
    onTimeout = serializers.ChoiceField(choices=OnDrainTimeout.choices, required=False)
    at = serializers.DateTimeField(required=False)
    reason = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)
    force = serializers.BooleanField(default=False)


class SigningKeyRotate(ApiView):
    """Rotate the agent's signing key: a rebind with `rotateKey` (webhooks/rebinds/operations.py),
    which publishes the new key before it signs and drains (or cuts over) the old one."""

    perms = {"POST": "webhooks.run_rebind"}
    serializer_class = RebindSerializer
    idempotent = True

    @extend_schema(request=RotateSerializer, responses={201: RebindSerializer})
    def post(self, request, slug):
        agent = agent_or_404(slug)
        body = RotateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        req = RebindRequest(
            agent=agent,
            rotate_key=True,
            policy=data.get("policy"),
            deadline_seconds=data.get("deadlineSeconds"),
            on_timeout=data.get("onTimeout"),
            at=data.get("at"),
            reason=data["reason"],
            force=data["force"],
        )
        rebind = rebinds.rebind_start(req, actor=self.actor)
        return Response(RebindSerializer(rebind).data, status=status.HTTP_201_CREATED)
