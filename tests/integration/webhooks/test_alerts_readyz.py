"""/readyz lists open alerts, and says so when it cannot read them (never an empty list)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError

from webhooks.models import Alert, AlertKind, Endpoint

pytestmark = pytest.mark.django_db


def test_readyz_lists_open_alerts_only(client):
    endpoint = Endpoint.objects.create(origin="https://hooks.example.org:443")
    Alert.objects.create(kind=AlertKind.DEAD_LETTER, endpoint=endpoint, message="gone", count=3)
    resolved = Alert.objects.create(kind=AlertKind.AUTH_REJECTED, endpoint=endpoint, message="x")
    Alert.objects.filter(pk=resolved.pk).update(resolved_at=resolved.created_at)
    alerts = client.get("/readyz").json()["alerts"]
    assert [(a["kind"], a["message"], a["count"]) for a in alerts] == [
        (AlertKind.DEAD_LETTER, "gone", 3)
    ]


def test_readyz_says_when_alerts_cannot_be_read(client, monkeypatch):
    def broken(*args, **kwargs):
        raise DatabaseError("relation webhooks_alert is gone")

    monkeypatch.setattr(Alert.objects, "filter", broken)
    [alert] = client.get("/readyz").json()["alerts"]
    assert alert["kind"] == "unreadable"
    assert "webhooks_alert is gone" in alert["message"]
