"""`/api/v1/deliveries/` refuses hostile filters with a 400 naming the filter (never a 500)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> APIClient:
    user = get_user_model().objects.create_user("ops", is_staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


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
