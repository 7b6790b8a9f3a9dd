"""The JSON 404 for any path under /api/ no route matches (instead of Django's HTML page)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.views import APIView

from a2a_platform.api.errors import not_found


@extend_schema(exclude=True)
class NoRoute(APIView):
    authentication_classes: list = []
    permission_classes: list = []

    def http_method_not_allowed(self, request, *args, **kwargs):
        raise not_found(f"no API route {request.path}")

    def get(self, request, *args, **kwargs):
        raise not_found(f"no API route {request.path}")

    post = put = patch = delete = get
