"""`/api/v1/deliveries/`: the admin's delivery permissions decide who may read and replay,
and hostile filters are a 400 naming the filter (never a 500)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agents.models import OperatorAction
from tests.api_tokens import api_client

pytestmark = pytest.mark.django_db


def _client(name: str, *perms: str, staff: bool = True) -> APIClient:
    return api_client(name, *perms, scope="operate", staff=staff)


@pytest.fixture
def staff_client() -> APIClient:
    return _client("ops", "view_delivery")


def test_reading_needs_view_and_replaying_needs_change_on_deliveries():
    replay = {"ids": ["00000000-0000-0000-0000-000000000001"]}
    nobody = _client("nobody", "view_delivery", "change_delivery", staff=False)
    idle = _client("idle")
    viewer = _client("viewer", "view_delivery")
    operator = _client("operator", "view_delivery", "change_delivery")
    for client in (nobody, idle):
        assert client.get("/api/v1/deliveries/").status_code == 403
        assert client.post("/api/v1/deliveries/replay", replay, format="json").status_code == 403
    assert viewer.get("/api/v1/deliveries/").status_code == 200
    assert viewer.post("/api/v1/deliveries/replay", replay, format="json").status_code == 403
    answer = operator.post("/api/v1/deliveries/replay", replay, format="json")
    assert answer.status_code == 200
    assert (answer.json()["replayed"], answer.json()["requested"]) == (0, 1)
    assert [s["reason"] for s in answer.json()["skipped"]] == ["not_found"]
    # Only the operator's call was audited: the refused ones never reached the service.
    audited = OperatorAction.objects.exclude(action="api_token_create")
    assert list(audited.values_list("actor", "action")) == [("api:operator", "replay_deliveries")]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("agent=a%00b", "agent"),
        ("endpoint=https%3A%2F%2Fx%00", "endpoint"),
        ("state=bogus", "state"),
        ("task=not-a-uuid", "task"),
    ],
)
def test_hostile_filters_are_a_400_naming_the_filter(staff_client, query, field):
    answer = staff_client.get(f"/api/v1/deliveries/?{query}")
    assert answer.status_code == 400, answer.content
    assert field in answer.json()["error"]["fields"]


def test_plain_filters_answer(staff_client):
    answer = staff_client.get("/api/v1/deliveries/?agent=nobody&endpoint=https://x.example:443")
    assert answer.status_code == 200
    assert answer.json()["results"] == []
