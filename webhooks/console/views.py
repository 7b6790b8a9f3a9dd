"""The operators' dashboard views (thin: the data is webhooks/console/dashboard.py's).

Both are staff-only: the JSON view is wrapped in `admin.site.admin_view` where it is routed
(a2a_platform/urls.py), the index is the admin site's own. A staff user sees the sections
their model permissions allow (`dashboard.sections_for`): no view permission on deliveries,
no delivery figure.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse

from webhooks.console import dashboard


def dashboard_for(request: HttpRequest) -> dict[str, Any]:
    """The dashboard as this (staff) user may see it."""
    return dashboard.dashboard_data(sections=dashboard.sections_for(request.user))


def dashboard_json(request: HttpRequest) -> JsonResponse:
    """What the admin index polls every few seconds (webhooks/static/webhooks/dashboard.js)."""
    response = JsonResponse(dashboard_for(request))
    response["Cache-Control"] = "no-store"
    return response
