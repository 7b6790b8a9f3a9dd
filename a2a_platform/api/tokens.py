"""`/api/v1/tokens/`: integrators' tokens. List (no secrets), create (the secret in the answer,
once; Idempotency-Key), read, revoke. Permissions: `platform_api.view_apitoken` to read,
`add_apitoken` to create, `change_apitoken` to revoke; no scope holds the last two, so tokens
are made and revoked by an operator's session (or the admin, or `manage.py create_api_token`),
never by another token."""

from __future__ import annotations

import django_filters
from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from a2a_platform.api import selectors
from a2a_platform.api.errors import invalid, not_found
from a2a_platform.api.models import ApiToken, TokenScope
from a2a_platform.api.resources import StrictBooleanFilter, uuid_param, uuid_path
from a2a_platform.api.services import api_token_create, api_token_revoke
from a2a_platform.api.views import ApiListView, ApiView
from tasks.api.serializers import WireModelSerializer, WireSerializer


class TokenSerializer(WireModelSerializer):
    user = serializers.CharField(source="user.get_username", read_only=True)
    createdBy = serializers.CharField(
        source="created_by.get_username", read_only=True, allow_null=True, default=None
    )

    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    lastUsedAt = serializers.DateTimeField(source="last_used_at", read_only=True, allow_null=True)
    expiresAt = serializers.DateTimeField(source="expires_at", read_only=True, allow_null=True)
    revokedAt = serializers.DateTimeField(source="revoked_at", read_only=True, allow_null=True)

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "scope",
            "prefix",
            "user",
            "createdBy",
            "createdAt",
            "lastUsedAt",
            "expiresAt",
            "revokedAt",
        ]


class NewTokenSerializer(TokenSerializer):
    secret = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="shown once, never again: null in an Idempotency-Key replay (never stored)",
    )

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "secret"]


class TokenCreateSerializer(WireSerializer):
    name = serializers.CharField(max_length=200)
    scope = serializers.ChoiceField(choices=TokenScope.choices)
    user = serializers.CharField(
        max_length=150, required=False, help_text="username (default: yours; others: superuser)"
    )
    expiresAt = serializers.DateTimeField(required=False)


class TokenFilter(django_filters.FilterSet):
    scope = django_filters.ChoiceFilter(choices=TokenScope.choices)
    revoked = StrictBooleanFilter(field_name="revoked_at", lookup_expr="isnull", exclude=True)
    user = django_filters.CharFilter(field_name="user__username", max_length=150)

    class Meta:
        model = ApiToken
        fields = ["scope", "revoked", "user"]


class TokenView(ApiView):
    read_perm = "platform_api.view_apitoken"
    write_perm = "platform_api.change_apitoken"


class TokenList(TokenView, ApiListView):
    serializer_class = TokenSerializer
    filterset_class = TokenFilter
    ordering = "-created_at"
    ordering_fields = ["created_at", "name"]
    perms = {"POST": "platform_api.add_apitoken"}
    idempotent = True

    def get_queryset(self):
        return selectors.token_list()

    @extend_schema(request=TokenCreateSerializer, responses={201: NewTokenSerializer})
    def post(self, request):
        body = TokenCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        user = request.user
        if "user" in data:
            user = get_user_model().objects.filter(username=data["user"]).first()
            if user is None:
                raise invalid("user", f"no user {data['user']!r}")
        new = api_token_create(
            name=data["name"],
            scope=data["scope"],
            user=user,
            created_by=request.user,
            expires_at=data.get("expiresAt"),
        )
        answer = {**TokenSerializer(new.token).data, "secret": new.secret}
        return Response(answer, status=status.HTTP_201_CREATED)


def _token(pk) -> ApiToken:
    token = selectors.token_get(uuid_param("tokenId", pk))
    if token is None:
        raise not_found(f"no token {pk}")
    return token


@extend_schema(parameters=[uuid_path("id")])
class TokenDetail(TokenView):
    serializer_class = TokenSerializer

    def get(self, request, pk):
        return Response(TokenSerializer(_token(pk)).data)


@extend_schema(parameters=[uuid_path("id")])
class TokenRevoke(TokenView):
    serializer_class = TokenSerializer

    @extend_schema(request=None, responses={200: TokenSerializer})
    def post(self, request, pk):
        token = api_token_revoke(token_id=_token(pk).pk, actor=self.actor)
        return Response(TokenSerializer(_token(token.pk)).data)
