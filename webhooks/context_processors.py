"""Open alerts for the admin index (only computed on admin pages)."""

from __future__ import annotations


def open_alerts(request) -> dict:
    if not request.path.startswith("/admin/") or not getattr(request.user, "is_staff", False):
        return {}
    from webhooks.models import Alert

    return {"open_alerts": list(Alert.objects.filter(resolved_at__isnull=True)[:20])}
