"""The worker REST API (/api/v1/worker/) through Django's test client, on PostgreSQL.

Every refused request is checked to have changed nothing: the task's state, `last_seq`, its
events, history, artifacts and dispatches are compared before and after.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from agents.services import api_key_create, api_key_revoke
from tasks import services, wire
from tasks.models import Artifact, DispatchState, ExecutorDispatch, Message, Task, TaskEvent
from tasks.states import TaskState
from tests.factories import AgentFactory, task_create, user_message

pytestmark = pytest.mark.django_db

API = "/api/v1/worker"
T0 = datetime(2031, 5, 4, 12, 0, 0, tzinfo=UTC)
LEASE = timedelta(seconds=60)  # A2A_DISPATCH_LEASE_SECONDS in the test profile


class Worker:
    """A worker backend: Django's test client with one bearer token."""

    def __init__(self, client, token: str | None) -> None:
        self.client = client
        self.token = token

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}

    def post(self, path: str, body: object = None, *, raw: str | None = None):
        data = raw if raw is not None else json.dumps(body if body is not None else {})
        return self.client.post(
            f"{API}/{path}", data, content_type="application/json", headers=self._headers()
        )

    def get(self, path: str, **params: str):
        return self.client.get(f"{API}/{path}", params, headers=self._headers())

    def claim(self):
        return self.post("claim")

    def renew(self, dispatch_id: int):
        return self.post(f"dispatches/{dispatch_id}/renew")

    def finish(self, dispatch_id: int, **body: object):
        return self.post(f"dispatches/{dispatch_id}/finish", body)

    def transition(self, task_id: object, state: str, message: object = None):
        body: dict[str, object] = {"state": state}
        if message is not None:
            body["message"] = message
        return self.post(f"tasks/{task_id}/transition", body)

    def artifact(self, task_id: object, artifact: object, **flags: object):
        return self.post(f"tasks/{task_id}/artifacts", {"artifact": artifact, **flags})

    def message(self, task_id: object, message: object):
        return self.post(f"tasks/{task_id}/messages", {"message": message})


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(T0, tick=False)
    return time_machine


@pytest.fixture
def external_agent(db):
    return AgentFactory(executor="external")


@pytest.fixture
def worker(client, external_agent):
    return Worker(client, api_key_create(agent=external_agent, name="w1", kind="worker").token)


@pytest.fixture
def other_worker(client, external_agent):
    """A second backend of the same agent, with its own token (a different claimant)."""
    return Worker(client, api_key_create(agent=external_agent, name="w2", kind="worker").token)


def new_task(agent, text: str = "hello") -> Task:
    return task_create(agent=agent, owner="anonymous", message=user_message(text))


def snapshot(task: Task) -> dict:
    """Everything a worker request could change about a task."""
    task.refresh_from_db()
    return {
        "state": task.state,
        "last_seq": task.last_seq,
        "status_timestamp": task.status_timestamp,
        "status_message": task.status_message,
        "events": list(TaskEvent.objects.filter(task=task).values_list("seq", "kind", "payload")),
        "messages": list(Message.objects.filter(task=task).values_list("message_id", "parts")),
        "artifacts": list(
            Artifact.objects.filter(task=task).values_list("artifact_id", "parts", "complete")
        ),
        "dispatches": list(
            ExecutorDispatch.objects.filter(task=task).values_list(
                "id", "state", "claimed_by", "claims", "lease_expires_at", "not_before"
            )
        ),
    }


def error(response) -> dict:
    return response.json()["error"]


def claimant(w: Worker) -> str:
    return f"api:{w.token.split('_')[1]}"


# --- authentication -------------------------------------------------------------------------


def test_worker_api_refuses_missing_and_bad_tokens(client, external_agent, worker):
    task = new_task(external_agent)
    before = snapshot(task)
    client_key = api_key_create(agent=external_agent, name="a client", kind="client")
    revoked = api_key_create(agent=external_agent, name="old", kind="worker")
    api_key_revoke(key_id=revoked.key.pk, actor="test")
    # Right prefix, wrong secret: the digest comparison, not the lookup, must refuse it.
    prefix = worker.token.split("_")[1]
    cases = {
        "missing": (None, "not_authenticated"),
        "garbage": ("nonsense", "authentication_failed"),
        "wrong secret": (f"a2a_{prefix}_{'x' * 43}", "authentication_failed"),
        "revoked": (revoked.token, "authentication_failed"),
        "client kind": (client_key.token, "authentication_failed"),
    }
    for label, (token, code) in cases.items():
        w = Worker(client, token)
        for response in (
            w.claim(),
            w.get("tasks"),
            w.renew(1),
            w.finish(1),
            w.transition(task.id, TaskState.WORKING.value),
            w.artifact(task.id, {"artifactId": "a", "parts": [{"text": "x"}]}),
            w.message(task.id, {"messageId": "m", "parts": [{"text": "x"}]}),
        ):
            assert response.status_code == 401, (label, response.content)
            assert error(response)["code"] == code, label
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="a2a-worker"'
    assert snapshot(task) == before


def test_worker_api_refuses_basic_scheme_and_disabled_agent(client, external_agent, worker):
    task = new_task(external_agent)
    before = snapshot(task)
    response = client.post(
        f"{API}/claim", headers={"Authorization": f"Basic {worker.token}"}
    )  # the right token under the wrong scheme
    assert response.status_code == 401
    external_agent.enabled = False
    external_agent.save(update_fields=["enabled"])
    response = worker.claim()
    assert response.status_code == 401
    assert error(response)["code"] == "authentication_failed"
    assert snapshot(task) == before


def test_worker_token_with_underscores_in_its_secret_authenticates(
    monkeypatch, external_agent, client
):
    # token_urlsafe's alphabet includes "_"; about half of all real tokens contain one.
    monkeypatch.setattr("a2a_platform.lib.crypto.secrets.token_urlsafe", lambda n: "s_e_c-r_e_t")
    w = Worker(client, api_key_create(agent=external_agent, name="w", kind="worker").token)
    assert w.token.count("_") > 2
    assert w.claim().status_code == 204


# --- claim ----------------------------------------------------------------------------------


def test_claim_returns_204_when_nothing_is_due(clock, client, external_agent, worker):
    assert worker.claim().status_code == 204
    # Another agent's pending work is not this worker's.
    other_agent = AgentFactory(executor="external")
    foreign = new_task(other_agent)
    response = worker.claim()
    assert response.status_code == 204
    assert response.content == b""
    assert foreign.dispatches.get().state == DispatchState.PENDING


def test_claim_takes_the_oldest_due_dispatch_with_a_lease(clock, external_agent, worker):
    first = new_task(external_agent, "first")
    clock.shift(timedelta(seconds=1))
    second = new_task(external_agent, "second")
    clock.shift(timedelta(seconds=1))

    response = worker.claim()

    assert response.status_code == 200
    body = response.json()
    dispatch = first.dispatches.get()
    assert body["dispatchId"] == dispatch.pk
    assert body["leaseExpiresAt"] == wire.timestamp_json(T0 + timedelta(seconds=2) + LEASE)
    assert body["progress"] == {}
    assert body["task"]["id"] == str(first.id)
    assert body["task"]["status"]["state"] == TaskState.SUBMITTED.value
    assert [p["text"] for m in body["task"]["history"] for p in m["parts"]] == ["first"]
    assert dispatch.state == DispatchState.CLAIMED
    assert dispatch.claimed_by == claimant(worker)
    assert dispatch.claims == 1
    assert dispatch.lease_expires_at == T0 + timedelta(seconds=2) + LEASE
    assert second.dispatches.get().state == DispatchState.PENDING


def test_claim_never_hands_out_a_claimed_dispatch(external_agent, worker, other_worker):
    tasks = [new_task(external_agent, f"t{i}") for i in range(2)]

    got = [worker.claim(), other_worker.claim(), worker.claim(), other_worker.claim()]

    assert [r.status_code for r in got] == [200, 200, 204, 204]
    claimed = [r.json()["task"]["id"] for r in got[:2]]
    assert claimed == [str(t.id) for t in tasks]
    holders = {
        str(d.task_id): d.claimed_by
        for d in ExecutorDispatch.objects.filter(task__in=tasks, state=DispatchState.CLAIMED)
    }
    assert holders == {
        str(tasks[0].id): claimant(worker),
        str(tasks[1].id): claimant(other_worker),
    }


def test_claim_refuses_an_agent_with_a_built_in_executor(client, agent):
    """A worker of an echo agent must not take dispatches that a Celery job is running."""
    task = new_task(agent)
    w = Worker(client, api_key_create(agent=agent, name="w", kind="worker").token)
    before = snapshot(task)
    response = w.claim()
    assert response.status_code == 409
    assert error(response)["code"] == "not_external"
    assert snapshot(task) == before


def test_task_list_shows_the_agents_tasks_in_a_state(external_agent, worker):
    mine = new_task(external_agent)
    working = new_task(external_agent)
    services.task_transition(task_id=working.id, to_state=TaskState.WORKING)
    new_task(AgentFactory(executor="external"))

    assert [t["id"] for t in worker.get("tasks").json()["tasks"]] == [str(mine.id)]
    listed = worker.get("tasks", state=TaskState.WORKING.value).json()["tasks"]
    assert [t["id"] for t in listed] == [str(working.id)]
    response = worker.get("tasks", state="working")
    assert response.status_code == 400
    assert error(response)["field"] == "state"


# --- lease: renew and finish ----------------------------------------------------------------


def test_renew_pushes_the_lease_for_the_holder_only(clock, external_agent, worker, other_worker):
    task = new_task(external_agent)
    dispatch_id = worker.claim().json()["dispatchId"]
    clock.shift(timedelta(seconds=30))

    response = worker.renew(dispatch_id)

    assert response.status_code == 200
    assert response.json() == {"dispatchId": dispatch_id, "renewed": True}
    dispatch = ExecutorDispatch.objects.get(pk=dispatch_id)
    assert dispatch.lease_expires_at == T0 + timedelta(seconds=30) + LEASE

    before = snapshot(task)
    clock.shift(timedelta(seconds=10))
    for response in (other_worker.renew(dispatch_id), worker.renew(dispatch_id + 1000)):
        assert response.status_code == 409
        assert error(response)["code"] == "lease_lost"
    assert snapshot(task) == before


def test_finish_releases_the_claim_for_the_holder_only(external_agent, worker, other_worker):
    task = new_task(external_agent)
    dispatch_id = worker.claim().json()["dispatchId"]
    before = snapshot(task)

    response = other_worker.finish(dispatch_id)
    assert response.status_code == 409
    assert error(response)["code"] == "lease_lost"
    assert snapshot(task) == before

    response = worker.finish(dispatch_id)
    assert response.status_code == 200
    assert response.json() == {"dispatchId": dispatch_id, "finished": True}
    dispatch = ExecutorDispatch.objects.get(pk=dispatch_id)
    assert dispatch.state == DispatchState.DONE
    assert dispatch.lease_expires_at is None
    # Done is done: a second finish or a renew finds nothing held.
    assert worker.finish(dispatch_id).status_code == 409
    assert worker.renew(dispatch_id).status_code == 409
    assert worker.claim().status_code == 204


def test_finish_with_run_again_after_makes_the_dispatch_pending_later(
    clock, external_agent, worker
):
    task = new_task(external_agent)
    dispatch_id = worker.claim().json()["dispatchId"]

    response = worker.finish(dispatch_id, runAgainAfter=30)

    assert response.status_code == 200
    dispatch = ExecutorDispatch.objects.get(pk=dispatch_id)
    assert dispatch.state == DispatchState.PENDING
    assert dispatch.not_before == T0 + timedelta(seconds=30)
    assert dispatch.lease_expires_at is None
    task.refresh_from_db()
    assert task.state == TaskState.SUBMITTED  # the task itself is untouched

    clock.shift(timedelta(seconds=29))
    assert worker.claim().status_code == 204  # not due yet
    clock.shift(timedelta(seconds=1))
    again = worker.claim()
    assert again.status_code == 200
    assert again.json()["dispatchId"] == dispatch_id
    dispatch.refresh_from_db()
    assert dispatch.state == DispatchState.CLAIMED
    assert dispatch.claims == 2


def test_a_not_yet_due_dispatch_does_not_block_younger_due_ones(clock, external_agent, worker):
    later = new_task(external_agent, "later")
    later_dispatch = worker.claim().json()["dispatchId"]
    assert worker.finish(later_dispatch, runAgainAfter=300).status_code == 200
    clock.shift(timedelta(seconds=1))
    now = new_task(external_agent, "now")

    assert worker.claim().json()["task"]["id"] == str(now.id)
    assert worker.claim().status_code == 204
    clock.shift(timedelta(seconds=300))
    assert worker.claim().json()["task"]["id"] == str(later.id)


def test_finish_with_run_again_after_on_a_finished_task_is_done(clock, external_agent, worker):
    task = new_task(external_agent)
    dispatch_id = worker.claim().json()["dispatchId"]
    assert worker.transition(task.id, TaskState.COMPLETED.value).status_code == 200

    # Completing closed the dispatch, so the claim is gone.
    assert worker.finish(dispatch_id, runAgainAfter=5).status_code == 409
    assert ExecutorDispatch.objects.get(pk=dispatch_id).state == DispatchState.DONE
    clock.shift(timedelta(seconds=10))
    assert worker.claim().status_code == 204


@pytest.mark.parametrize("value", ["soon", -1, 86401, None, [5], "NaN"])
def test_finish_refuses_a_bad_run_again_after(external_agent, worker, value):
    task = new_task(external_agent)
    dispatch_id = worker.claim().json()["dispatchId"]
    before = snapshot(task)
    response = worker.finish(dispatch_id, runAgainAfter=value)
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_request"
    assert "runAgainAfter" in error(response)["fields"]
    assert snapshot(task) == before


# --- transitions ----------------------------------------------------------------------------


def test_transition_legal_moves_append_events(external_agent, worker):
    task = new_task(external_agent)

    response = worker.transition(task.id, TaskState.WORKING.value, "thinking")

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == str(task.id)
    assert body["status"]["state"] == TaskState.WORKING.value
    status_message = body["status"]["message"]
    assert status_message["role"] == "ROLE_AGENT"
    assert status_message["parts"] == [{"text": "thinking"}]
    assert status_message["taskId"] == str(task.id)
    assert status_message["contextId"] == task.context_id

    agent_message = {"messageId": "s1", "role": "ROLE_AGENT", "parts": [{"text": "done"}]}
    response = worker.transition(task.id, TaskState.COMPLETED.value, agent_message)
    assert response.status_code == 200
    assert response.json()["status"]["message"]["messageId"] == "s1"

    task.refresh_from_db()
    assert task.state == TaskState.COMPLETED
    assert task.last_seq == 3
    events = TaskEvent.objects.filter(task=task).order_by("seq")
    assert [(e.seq, e.payload["statusUpdate"]["status"]["state"]) for e in events] == [
        (1, TaskState.SUBMITTED.value),
        (2, TaskState.WORKING.value),
        (3, TaskState.COMPLETED.value),
    ]


def test_transition_illegal_move_is_409_and_changes_nothing(external_agent, worker):
    task = new_task(external_agent)
    assert worker.transition(task.id, TaskState.INPUT_REQUIRED.value, "which?").status_code == 200
    before = snapshot(task)

    response = worker.transition(task.id, TaskState.REJECTED.value)

    assert response.status_code == 409
    assert error(response) == {
        "code": "illegal_transition",
        "message": "illegal transition: input-required cannot move to rejected",
        "fromState": TaskState.INPUT_REQUIRED.value,
        "toState": TaskState.REJECTED.value,
    }
    assert snapshot(task) == before

    assert worker.transition(task.id, TaskState.CANCELED.value).status_code == 200
    before = snapshot(task)
    response = worker.transition(task.id, TaskState.WORKING.value)
    assert response.status_code == 409
    assert error(response)["code"] == "illegal_transition"
    assert "terminal" in error(response)["message"]
    assert snapshot(task) == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"state": "working"}, "state"),
        ({"state": 5}, "state"),
        ({"state": None}, "state"),
        ({}, "state"),
        ({"state": TaskState.WORKING.value, "message": 42}, "message"),
        ({"state": TaskState.WORKING.value, "message": ["hi"]}, "message"),
    ],
)
def test_transition_wrong_types_are_400(external_agent, worker, body, field):
    task = new_task(external_agent)
    before = snapshot(task)
    response = worker.post(f"tasks/{task.id}/transition", body)
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_request"
    assert list(error(response)["fields"]) == [field]
    assert snapshot(task) == before


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"messageId": "s", "role": "ROLE_USER", "parts": [{"text": "x"}]}, "message.role"),
        ({"messageId": "s", "role": "ROLE_AGENT", "parts": []}, "message.parts"),
        ({"messageId": "s", "role": "ROLE_AGENT", "parts": [{}]}, "message.parts[0]"),
        ({"role": "ROLE_AGENT", "parts": [{"text": "x"}]}, "message.messageId"),
        ("nul \x00 inside", "message"),
        (
            {"messageId": "s", "role": "ROLE_AGENT", "parts": [{"text": "a\x00b"}]},
            "message.parts[0].text",
        ),
    ],
)
def test_transition_bad_status_message_is_400_with_its_path(external_agent, worker, message, field):
    task = new_task(external_agent)
    before = snapshot(task)
    response = worker.transition(task.id, TaskState.WORKING.value, message)
    assert response.status_code == 400
    assert error(response)["code"] == "invalid_payload"
    assert error(response)["field"] == field
    assert snapshot(task) == before


# --- artifacts ------------------------------------------------------------------------------


def test_artifact_chunks_are_appended_in_order(external_agent, worker):
    task = new_task(external_agent)
    chunks = [
        ({"artifactId": "report", "name": "Report", "parts": [{"text": "a"}]}, {}),
        ({"artifactId": "report", "parts": [{"text": "b"}]}, {"append": True}),
        (
            {"artifactId": "report", "parts": [{"data": {"n": 3}}]},
            {"append": True, "lastChunk": True},
        ),
    ]
    for artifact, flags in chunks:
        response = worker.artifact(task.id, artifact, **flags)
        assert response.status_code == 200, response.content

    body = response.json()
    assert body["artifacts"] == [
        {
            "artifactId": "report",
            "name": "Report",
            "parts": [{"text": "a"}, {"text": "b"}, {"data": {"n": 3}}],
        }
    ]
    stored = Artifact.objects.get(task=task)
    assert (stored.chunks, stored.complete) == (3, True)
    events = TaskEvent.objects.filter(task=task, kind="artifact").order_by("seq")
    updates = [e.payload["artifactUpdate"] for e in events]
    assert [e.seq for e in events] == [2, 3, 4]
    assert [(u.get("append", False), u.get("lastChunk", False)) for u in updates] == [
        (False, False),
        (True, False),
        (True, True),
    ]
    assert updates[1]["artifact"]["parts"] == [{"text": "b"}]  # the event carries the chunk

    before = snapshot(task)
    late = worker.artifact(task.id, {"artifactId": "report", "parts": [{"text": "c"}]}, append=True)
    assert late.status_code == 400
    assert error(late) == {
        "code": "invalid_payload",
        "message": "its last chunk was already added",
        "field": "artifact",
    }
    assert snapshot(task) == before


def test_artifact_on_a_finished_task_is_409(external_agent, worker):
    task = new_task(external_agent)
    services.task_transition(task_id=task.id, to_state=TaskState.COMPLETED)
    before = snapshot(task)
    response = worker.artifact(task.id, {"artifactId": "a", "parts": [{"text": "x"}]})
    assert response.status_code == 409
    assert error(response)["code"] == "task_terminal"
    assert error(response)["state"] == TaskState.COMPLETED.value
    assert snapshot(task) == before


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"artifact": {"artifactId": "a", "parts": []}}, "invalid_payload", "artifact.parts"),
        ({"artifact": {"artifactId": "a"}}, "invalid_payload", "artifact.parts"),
        ({"artifact": {"parts": [{"text": "x"}]}}, "invalid_payload", "artifact.artifactId"),
        (
            {"artifact": {"artifactId": "a", "parts": [{"text": "x"}, {}]}},
            "invalid_payload",
            "artifact.parts[1]",
        ),
        (
            {"artifact": {"artifactId": "a", "parts": [{"text": "nul\x00"}]}},
            "invalid_payload",
            "artifact.parts[0].text",
        ),
        (
            {"artifact": {"artifactId": "a", "parts": [{"data": {"k": ["ok", "\x00"]}}]}},
            "invalid_payload",
            "artifact.parts[0].data.k[1]",
        ),
        (
            {"artifact": {"artifactId": "a\x00", "parts": [{"text": "x"}]}},
            "invalid_payload",
            "artifact.artifactId",
        ),
        (
            {"artifact": {"artifactId": "a" * 256, "parts": [{"text": "x"}]}},
            "invalid_payload",
            "artifact.artifactId",
        ),
        (
            {"artifact": {"artifactId": "a", "name": "n" * 256, "parts": [{"text": "x"}]}},
            "invalid_payload",
            "artifact.name",
        ),
        ({"artifact": "text"}, "invalid_payload", "artifact"),
        (
            {"artifact": {"artifactId": 7, "parts": [{"text": "x"}]}},
            "invalid_payload",
            "artifact.artifactId",  # the field itself, not its object (tasks/wire.py)
        ),
        (
            {"artifact": {"artifactId": "a", "parts": [{"text": "x"}]}, "append": "maybe"},
            "invalid_request",
            None,
        ),
        ({"append": True}, "invalid_request", None),
    ],
)
def test_artifact_bad_input_is_400_and_changes_nothing(external_agent, worker, body, code, field):
    task = new_task(external_agent)
    before = snapshot(task)
    response = worker.post(f"tasks/{task.id}/artifacts", body)
    assert response.status_code == 400, response.content
    assert error(response)["code"] == code
    if field is not None:
        assert error(response)["field"] == field
    assert snapshot(task) == before


# --- agent messages -------------------------------------------------------------------------


def test_message_appends_an_agent_message(external_agent, worker):
    task = new_task(external_agent)

    response = worker.message(task.id, {"messageId": "m-1", "parts": [{"text": "on it"}]})

    assert response.status_code == 200
    history = response.json()["history"]
    assert [(m["role"], m["parts"]) for m in history] == [
        ("ROLE_USER", [{"text": "hello"}]),
        ("ROLE_AGENT", [{"text": "on it"}]),
    ]
    assert history[1]["messageId"] == "m-1"
    task.refresh_from_db()
    assert task.last_seq == 2
    event = TaskEvent.objects.get(task=task, seq=2)
    assert event.kind == "message"
    assert event.payload["message"]["role"] == "ROLE_AGENT"
    assert event.payload["message"]["taskId"] == str(task.id)
    # An agent message does not ask for another executor run.
    assert task.dispatches.count() == 1


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x"}]}, "message.role"),
        ({"messageId": "m", "role": "ROLE_UNSPECIFIED", "parts": [{"text": "x"}]}, "message.role"),
        ({"messageId": "m", "parts": []}, "message.parts"),
        ({"messageId": "m", "parts": [{"text": "x"}, {"url": ""}]}, "message.parts[1].url"),
        ({"parts": [{"text": "x"}]}, "message.messageId"),
        ({"messageId": "m" * 256, "parts": [{"text": "x"}]}, "message.messageId"),
        ({"messageId": "m", "parts": [{"text": "x\x00y"}]}, "message.parts[0].text"),
        ({"messageId": "m", "parts": [{"text": "x\ud800"}]}, "message.parts[0].text"),
        (
            {"messageId": "m", "parts": [{"text": "x"}], "metadata": {"k": "\x00"}},
            "message.metadata.k",
        ),
        (
            {"messageId": "m", "parts": [{"data": {"k\x00": 1}}]},
            "message.parts[0].data.k\\u0000",
        ),
        ("just text", "message"),
    ],
)
def test_message_bad_input_is_400_and_changes_nothing(external_agent, worker, message, field):
    task = new_task(external_agent)
    before = snapshot(task)
    response = worker.message(task.id, message)
    assert response.status_code == 400, response.content
    assert error(response)["code"] == "invalid_payload"
    assert error(response)["field"] == field
    assert snapshot(task) == before


def test_message_to_a_finished_task_is_409(external_agent, worker):
    task = new_task(external_agent)
    services.task_transition(task_id=task.id, to_state=TaskState.FAILED)
    before = snapshot(task)
    response = worker.message(task.id, {"messageId": "m", "parts": [{"text": "late"}]})
    assert response.status_code == 409
    assert error(response)["code"] == "task_terminal"
    assert snapshot(task) == before


# --- scoping and malformed requests ---------------------------------------------------------


def test_another_agents_task_is_not_found(external_agent, worker):
    foreign = new_task(AgentFactory(executor="external"))
    before = snapshot(foreign)
    for task_id in (foreign.id, "not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        for response in (
            worker.transition(task_id, TaskState.WORKING.value),
            worker.artifact(task_id, {"artifactId": "a", "parts": [{"text": "x"}]}),
            worker.message(task_id, {"messageId": "m", "parts": [{"text": "x"}]}),
        ):
            assert response.status_code == 404, response.content
            assert error(response)["code"] == "task_not_found"
    assert snapshot(foreign) == before


def test_another_agents_dispatch_cannot_be_renewed_or_finished(client, external_agent, worker):
    other_agent = AgentFactory(executor="external")
    foreign = new_task(other_agent)
    foreign_worker = Worker(
        client, api_key_create(agent=other_agent, name="w", kind="worker").token
    )
    dispatch_id = foreign_worker.claim().json()["dispatchId"]
    before = snapshot(foreign)
    assert worker.renew(dispatch_id).status_code == 409
    assert worker.finish(dispatch_id).status_code == 409
    assert snapshot(foreign) == before


@pytest.mark.parametrize("path", ["transition", "artifacts", "messages"])
@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ('{"state": "TASK_STATE_WORKING"', "parse_error"),
        ("not json", "parse_error"),
        ('{"state": NaN}', "parse_error"),
        ("[1, 2]", "invalid_request"),
        ('"a string"', "invalid_request"),
    ],
)
def test_malformed_json_is_400_and_changes_nothing(external_agent, worker, path, raw, code):
    task = new_task(external_agent)
    before = snapshot(task)
    response = worker.post(f"tasks/{task.id}/{path}", raw=raw)
    assert response.status_code == 400, response.content
    assert error(response)["code"] == code
    assert snapshot(task) == before


def test_malformed_finish_body_keeps_the_claim(external_agent, worker):
    task = new_task(external_agent)
    dispatch_id = worker.claim().json()["dispatchId"]
    before = snapshot(task)
    response = worker.post(f"dispatches/{dispatch_id}/finish", raw="{oops")
    assert response.status_code == 400
    assert error(response)["code"] == "parse_error"
    assert snapshot(task) == before


def test_finish_without_a_body_ends_the_dispatch(client, external_agent, worker):
    new_task(external_agent)
    dispatch_id = worker.claim().json()["dispatchId"]
    # As an HTTP client sends a POST with no body: no Content-Type, no length (Django's
    # client.post would send an empty multipart form, which the API refuses: JSON only).
    response = client.generic(
        "POST",
        f"{API}/dispatches/{dispatch_id}/finish",
        headers={"Authorization": f"Bearer {worker.token}"},
    )
    assert response.status_code == 200
    assert ExecutorDispatch.objects.get(pk=dispatch_id).state == DispatchState.DONE


def test_wrong_media_type_and_method_are_refused(client, external_agent, worker):
    task = new_task(external_agent)
    before = snapshot(task)
    auth = {"Authorization": f"Bearer {worker.token}"}
    response = client.post(
        f"{API}/tasks/{task.id}/transition",
        "state=TASK_STATE_WORKING",
        content_type="text/plain",
        headers=auth,
    )
    assert response.status_code == 415
    assert error(response)["code"] == "unsupported_media_type"
    response = client.get(f"{API}/claim", headers=auth)
    assert response.status_code == 405
    assert error(response)["code"] == "method_not_allowed"
    assert snapshot(task) == before


# --- the rules behind the views: services any interface calls ---------------------------------


def test_dispatch_claim_next_refuses_a_built_in_executor_whatever_the_caller(agent):
    from tasks.dispatch import dispatch_claim_next
    from tasks.errors import NotExternalExecutor

    task = new_task(agent)
    before = snapshot(task)
    with pytest.raises(NotExternalExecutor) as refused:
        dispatch_claim_next(agent=agent, worker="w")
    assert refused.value.executor == agent.executor
    assert snapshot(task) == before


def test_task_add_agent_message_refuses_a_user_role_and_fills_an_omitted_one(external_agent):
    from tasks.errors import InvalidPayload

    task = new_task(external_agent)
    before = snapshot(task)
    with pytest.raises(InvalidPayload) as refused:
        services.task_add_agent_message(task_id=task.pk, message=user_message("hi"))
    assert refused.value.field == "message.role"
    assert snapshot(task) == before

    message = {"messageId": "m-1", "parts": [{"text": "from the agent"}]}
    services.task_add_agent_message(task_id=task.pk, message=message)
    assert Message.objects.get(task=task, message_id="m-1").role == "ROLE_AGENT"
