"""Open alerts for admin pages, and the dashboard with the operators' recent actions for the
admin index (only computed on admin pages, for staff)."""

from __future__ import annotations

from django.urls import NoReverseMatch, reverse


def open_alerts(request) -> dict:
    if not request.path.startswith("/admin/") or not getattr(request.user, "is_staff", False):
        return {}
    from webhooks.models import Alert

    context: dict = {"open_alerts": list(Alert.objects.filter(resolved_at__isnull=True)[:20])}
    try:
        index, poll = reverse("admin:index"), reverse("admin_dashboard")
    except NoReverseMatch:  # a URLconf without the dashboard (some tests route their own)
        return context
    if request.path == index:
        from webhooks.console.dashboard import recent_actions
        from webhooks.console.views import dashboard_for

        context["dashboard"] = dashboard_for(request)
        context["dashboard_url"] = poll
        context["recent_operator_actions"] = recent_actions(request.user)
    return context
