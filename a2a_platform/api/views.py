"""The base of every management API view (`ApiView`): authentication (Bearer token or
session), the scoped permission the view names, the throttle, query parameters without NUL,
Idempotency-Key on creating POSTs, cursor pagination, django-filter and whitelisted ordering.

A resource view sets `read_perm` / `write_perm` (or `perms` per method), and for a list
`queryset`, `serializer_class`, `filterset_class`, `ordering_fields` and `ordering`; it
parses, calls one service or selector, and renders. `self.actor` names the caller for audits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import generics
from rest_framework.authentication import SessionAuthentication
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle

from a2a_platform.api import idempotency
from a2a_platform.api.auth import BearerTokenAuthentication, actor, principal
from a2a_platform.api.errors import invalid
from a2a_platform.api.filters import WhitelistedOrdering
from a2a_platform.api.pagination import CursorPages
from a2a_platform.api.permissions import ScopedPermission, perm_for
from a2a_platform.api.services import idempotency_release


@dataclass(frozen=True)
class RateBudget:
    """What is left of the caller's window: sent as RateLimit-Limit, RateLimit-Remaining and
    RateLimit-Reset (seconds until the window frees a request) on every answer."""

    limit: int
    remaining: int
    reset: int

    def headers(self) -> dict[str, str]:
        return {
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(self.remaining),
            "RateLimit-Reset": str(self.reset),
        }


class ApiThrottle(SimpleRateThrottle):
    """Requests per principal (token or session user) in a sliding window; the rate is
    A2A_API_RATE (settings REST_FRAMEWORK DEFAULT_THROTTLE_RATES). Beyond it: 429 `throttled`
    with Retry-After."""

    scope = "platform_api"

    def allow_request(self, request, view) -> bool:
        allowed = super().allow_request(request, view)
        if self.rate is not None and getattr(self, "history", None) is not None:
            oldest = self.history[-1] if self.history else self.now
            request.rate_budget = RateBudget(
                limit=self.num_requests,
                remaining=max(0, self.num_requests - len(self.history)),
                reset=max(0, math.ceil(oldest + self.duration - self.now)),
            )
        return allowed

    def get_cache_key(self, request, view):
        if request.user is not None and request.user.is_authenticated:
            ident = principal(request)
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class ApiView(generics.GenericAPIView):
    authentication_classes = [BearerTokenAuthentication, SessionAuthentication]
    permission_classes = [ScopedPermission]
    throttle_classes = [ApiThrottle]
    pagination_class = CursorPages
    filter_backends = [DjangoFilterBackend, WhitelistedOrdering]
    read_perm: str | None = None
    write_perm: str | None = None
    perms: dict[str, str] | None = None
    # Creating POSTs take an Idempotency-Key.
    idempotent = False
    _claim = None

    def required_perm(self, request) -> str | None:
        return perm_for(self, request)

    @property
    def actor(self) -> str:
        return actor(self.request)

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        for name, value in request.query_params.lists():
            if any("\x00" in v for v in value) or "\x00" in name:
                raise invalid(name, "must not contain NUL characters (U+0000)")
            if "" in value:
                # An empty filter is refused rather than read as "no filter" (or as a value).
                raise invalid(name, "empty: leave the parameter out for no filter")
        if self.idempotent and request.method == "POST":
            self._claim = idempotency.claim(request)

    def handle_exception(self, exc):
        if isinstance(exc, idempotency.Replay):
            return idempotency.replay_response(exc)
        return super().handle_exception(exc)

    def finalize_response(self, request, response, *args, **kwargs):
        budget = getattr(request, "rate_budget", None)
        if budget is not None:
            for name, value in budget.headers().items():
                response[name] = value
        if self._claim is not None:
            idempotency.finish(self._claim, response)
            self._claim = None
        return super().finalize_response(request, response, *args, **kwargs)

    def dispatch(self, request, *args, **kwargs):
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            # An exception no handler answered (a 500): the retry must run again.
            if self._claim is not None:
                idempotency_release(claim_id=self._claim.row.pk)
                self._claim = None

    def list_response(self, queryset, serializer_class=None) -> Response:
        """Filter, order and paginate `queryset`; render a page with the serializer."""
        serializer_class = serializer_class or self.get_serializer_class()
        page = self.paginate_queryset(self.filter_queryset(queryset))
        return self.get_paginated_response(serializer_class(page, many=True).data)


class ApiListView(ApiView):
    """A list: GET filters (`filterset_class`), orders (`ordering`, `ordering_fields`) and
    pages `get_queryset()` with `serializer_class`; documented as a paginated list."""

    is_list = True

    def get(self, request, *args, **kwargs):
        return self.list_response(self.get_queryset())
