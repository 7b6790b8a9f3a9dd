"""`/api/v1/alerts/` (list with filters, resolve through the service, audited once) and
`/api/v1/dashboard` (webhooks/console/dashboard.py's figures, sections by scoped permission), over
HTTP against a live web process."""

from __future__ import annotations

import pytest

from agents.models import OperatorAction
from tests.api_tokens import bearer, token_for, user_with
from tests.integration.api.live_api import _live_api, live_api  # noqa: F401 (fixtures)
from webhooks.models import Alert, AlertKind, Endpoint


@pytest.fixture
def alerts():
    endpoint = Endpoint.objects.create(origin="https://hooks.example.org:443")
    failing = Alert.objects.create(
        kind=AlertKind.ENDPOINT_FAILING, endpoint=endpoint, message="failing"
    )
    dead = Alert.objects.create(kind=AlertKind.DEAD_LETTER, endpoint=endpoint, message="dead")
    old = Alert.objects.create(kind=AlertKind.DEAD_LETTER, message="old")
    Alert.objects.filter(pk=old.pk).update(resolved_at=old.created_at)
    return failing, dead, old


def test_alerts_filter_then_resolve_once_audited(live_api, alerts):
    failing, dead, old = alerts
    ops = bearer(token_for(user_with("ops", "view_alert", "change_alert"), "operate"))

    def ids(**params):
        answer = live_api.get("/api/v1/alerts/", params=params, headers=ops)
        assert answer.status_code == 200, answer.text
        return {a["id"] for a in answer.json()["results"]}

    assert ids() == {failing.pk, dead.pk, old.pk}
    assert ids(open="true") == {failing.pk, dead.pk}
    assert ids(open="false") == {old.pk}
    assert ids(kind="dead_letter", open="true") == {dead.pk}
    bad = live_api.get("/api/v1/alerts/", params={"kind": "boredom"}, headers=ops)
    assert bad.status_code == 400
    assert "kind" in bad.json()["error"]["fields"]

    resolved = live_api.post(f"/api/v1/alerts/{dead.pk}/resolve", headers=ops)
    assert resolved.status_code == 200, resolved.text
    assert resolved.json()["resolvedAt"]
    again = live_api.post(f"/api/v1/alerts/{dead.pk}/resolve", headers=ops)
    assert again.status_code == 200
    assert list(OperatorAction.objects.filter(action="resolve_alert").values_list("actor")) == [
        ("api:ops",)
    ]
    assert ids(open="true") == {failing.pk}
    gone = live_api.post("/api/v1/alerts/999999/resolve", headers=ops)
    assert gone.status_code == 404, gone.text
    # Not an id at all (past a bigint, or not a number): the 400 of every malformed path id.
    for malformed in (2**70, "x"):
        bad = live_api.post(f"/api/v1/alerts/{malformed}/resolve", headers=ops)
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["field"] == "alertId"


def test_a_read_token_cannot_resolve(live_api, alerts):
    _, dead, _ = alerts
    user = user_with("both", "view_alert", "change_alert")
    read = bearer(token_for(user, "read"))
    answer = live_api.post(f"/api/v1/alerts/{dead.pk}/resolve", headers=read)
    assert answer.status_code == 403
    dead.refresh_from_db()
    assert dead.resolved_at is None
    assert not OperatorAction.objects.filter(action="resolve_alert").exists()


def test_the_dashboard_is_the_admins_figures_by_scoped_permission(live_api, alerts):
    from webhooks.console import dashboard

    full = user_with(
        "watcher", "view_agent", "view_delivery", "view_endpoint", "view_alert", "view_rebind"
    )
    answer = live_api.get("/api/v1/dashboard", headers=bearer(token_for(full, "read")))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    expected = dashboard.dashboard_data()
    assert set(body) == set(expected)
    assert body["sections"] == ["alerts", "deliveries", "endpoints", "rebinds"]
    assert body["alerts"] == expected["alerts"]
    assert body["totals"] == expected["totals"]

    # Only what the token's user may view (and the scope allows): readiness and agents here.
    narrow = user_with("narrow", "view_agent", "change_alert")
    limited = live_api.get("/api/v1/dashboard", headers=bearer(token_for(narrow, "read"))).json()
    assert limited["sections"] == []
    assert set(limited) == {"generatedAt", "sections", "readiness", "agents"}
    nobody = user_with("nobody")
    refused = live_api.get("/api/v1/dashboard", headers=bearer(token_for(nobody, "read")))
    assert refused.status_code == 403
