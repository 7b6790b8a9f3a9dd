"""The rebind API (/api/v1/rebinds/) in process over DRF with a `rebind` token: the same
services as the command and the console, the admin's permissions, every error shape, and the
same audit rows."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from agents.models import OperatorAction
from tasks import services
from tasks.states import TaskState
from tests.api_tokens import api_client
from tests.factories import AgentFactory
from tests.integration.webhooks.conftest import public_dns  # noqa: F401 (fixture)
from tests.protocol_push import task_with_push
from webhooks.models import ChannelMove, Rebind, RebindState

# Transactional: the tasks and their push configs are made through the protocol app, whose ORM
# calls run on other threads (tests/protocol_push.py).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("public_dns")]

V1 = "https://client.example.org/hooks/v1/"
V2 = "https://client.example.org/hooks/v2/"
MOVE = {"agent": "api-agent", "movePrefix": {"old": V1, "new": V2}}


def _client(name: str, *perms: str) -> APIClient:
    return api_client(name, *perms, scope="rebind")


@pytest.fixture
def agent():
    agent = AgentFactory(slug="api-agent", executor="external")
    for i in range(2):
        task = task_with_push(agent, f"{V1}task-{i}", config_id=f"cfg-{i}")
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    return agent


def test_preview_then_start_then_read_and_cut_over(agent):
    api = _client("runner", "view_rebind", "run_rebind")
    preview = api.post("/api/v1/rebinds/", {**MOVE, "preview": True}, format="json")
    assert preview.status_code == 200, preview.content
    assert (preview.json()["inFlight"], preview.json()["conflict"]) == (2, None)
    # The pre-checks as the console lists them: the new URL permitted, no key to publish,
    # no open rebind in the way.
    results = [c["result"] for c in preview.json()["checks"]]
    assert results == ["passed", "not needed", "passed"], preview.json()["checks"]
    assert not Rebind.objects.exists()
    started = api.post("/api/v1/rebinds/", MOVE, format="json")
    assert started.status_code == 201, started.content
    rebind_id = started.json()["id"]
    assert started.json()["state"] == RebindState.DRAINING
    detail = api.get(f"/api/v1/rebinds/{rebind_id}").json()
    assert len(detail["onOldVersion"]) == 2
    assert detail["counts"]["noticePending"] == 2
    listed = api.get("/api/v1/rebinds/", {"state": "draining"}).json()["results"]
    assert [r["id"] for r in listed] == [rebind_id]
    again = {"agent": "api-agent", "rotateKey": True}
    conflict = api.post("/api/v1/rebinds/", again, format="json")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "rebind_conflict"
    assert conflict.json()["error"]["rebind"] == rebind_id
    cut = api.post(f"/api/v1/rebinds/{rebind_id}/cutover", format="json")
    assert cut.json()["state"] == RebindState.CUT_OVER
    again = api.post(f"/api/v1/rebinds/{rebind_id}/cutover", format="json")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "illegal_transition"
    actions = set(OperatorAction.objects.values_list("action", "actor"))
    assert {("rebind_start", "api:runner"), ("rebind_cut_over", "api:runner")} <= actions


def test_move_now_and_finish_on_old_through_the_api(agent):
    api = _client("runner", "view_rebind", "run_rebind")
    rebind_id = api.post("/api/v1/rebinds/", MOVE, format="json").json()["id"]
    first, second = ChannelMove.objects.order_by("pk").values_list("pk", flat=True)
    moved = api.post(f"/api/v1/rebinds/{rebind_id}/move-now", {"moves": [first]}, format="json")
    kept = api.post(
        f"/api/v1/rebinds/{rebind_id}/finish-on-old", {"moves": [second]}, format="json"
    )
    assert (moved.json(), kept.json()) == ({"changed": 1}, {"changed": 1})
    states = dict(ChannelMove.objects.values_list("pk", "state"))
    assert states == {first: "moved", second: "finishing_on_old"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"agent": "nobody", "rotateKey": True}, "agent"),
        ({**MOVE, "movePrefix": {"old": V2, "new": V1}}, "movePrefix.old"),
        ({"agent": "api-agent", "rotateKey": True, "deadlineSeconds": -1}, "deadlineSeconds"),
        ({"agent": "api-agent"}, "body"),
        # snake_case is not the API's spelling: refused by name, never read as nothing
        ({"agent": "api-agent", "rotate_key": True}, "rotate_key"),
    ],
)
def test_refusals_are_400_with_the_field_and_write_nothing(agent, body, field):
    api = _client("runner", "view_rebind", "run_rebind")
    answer = api.post("/api/v1/rebinds/", body, format="json")
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_request", field)
    assert error["message"]
    assert error["fields"][field]
    assert not Rebind.objects.exists()


def test_permissions_reading_needs_view_and_writing_needs_run_rebind(agent):
    viewer = _client("viewer", "view_rebind")
    nobody = _client("nobody")
    assert viewer.get("/api/v1/rebinds/").status_code == 200
    assert nobody.get("/api/v1/rebinds/").status_code == 403
    assert viewer.post("/api/v1/rebinds/", MOVE, format="json").status_code == 403
    assert not Rebind.objects.exists()
    malformed = viewer.get("/api/v1/rebinds/not-a-uuid")
    assert malformed.status_code == 400
    assert malformed.json()["error"]["field"] == "rebindId"
    assert viewer.get("/api/v1/rebinds/", {"state": "sideways"}).status_code == 400


def test_a_retried_start_with_its_idempotency_key_starts_one_rebind(agent):
    api = _client("runner", "view_rebind", "run_rebind")
    key = {"HTTP_IDEMPOTENCY_KEY": "start-v2-move"}
    first = api.post("/api/v1/rebinds/", MOVE, format="json", **key)
    retry = api.post("/api/v1/rebinds/", MOVE, format="json", **key)
    assert (first.status_code, retry.status_code) == (201, 201)
    assert retry.json() == first.json()
    assert Rebind.objects.count() == 1
    assert OperatorAction.objects.filter(action="rebind_start").count() == 1
    other = api.post("/api/v1/rebinds/", {**MOVE, "reason": "again"}, format="json", **key)
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
