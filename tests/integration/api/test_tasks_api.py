"""`/api/v1/tasks/` over HTTP against a live web process: tasks opened through the A2A
protocol and the services, listed by every filter, ordering and cursor page, read with their
history, artifacts and channel history (a real rebind's cutover), credentials never shown;
what each scope may read; hostile input is a 400 naming the parameter."""

from __future__ import annotations

import base64
import datetime as dt

import httpx
import pytest

from agents.services import api_key_create
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests import protocol_push
from tests.factories import AgentFactory, task_create, user_message
from webhooks.rebinds.operations import RebindRequest, rebind_cutover, rebind_start

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("public_dns")]

V1 = "https://client.example.org/hooks/v1/"
V2 = "https://client.example.org/hooks/v2/"
SECRETS = ("tok-3141592653", "cred-2718281828")


def _cursor(query: str) -> str:
    """A cursor as DRF encodes one (base64 of a query string), with any content."""
    return base64.b64encode(query.encode()).decode()


@pytest.fixture
def store(api_web, http):
    """Two agents' tasks: one opened over the protocol, the rest through the services; one
    with an artifact and a push config with credentials that a cutover orphans."""
    alpha = AgentFactory(slug="alpha", executor="external")
    beta = AgentFactory(slug="beta", executor="external")
    key = api_key_create(agent=alpha, name="client")
    sent = http.post(
        "/alpha/message:send",
        headers={"A2A-Version": "1.0", "Authorization": f"Bearer {key.token}"},
        json={
            "message": user_message("over the wire"),
            "configuration": {"returnImmediately": True},
        },
    )
    assert sent.status_code == 200, sent.text
    wired = sent.json()["task"]["id"]
    made = {"wired": wired}
    made["working"] = task_create(
        agent=alpha, owner="anonymous", message=user_message("a"), context_id="ctx-1"
    ).pk
    services.task_transition(task_id=made["working"], to_state=TaskState.WORKING)
    made["done"] = task_create(
        agent=alpha, owner="anonymous", message=user_message("b"), context_id="ctx-1"
    ).pk
    services.task_transition(task_id=made["done"], to_state=TaskState.WORKING)
    services.task_add_artifact(
        task_id=made["done"],
        artifact={"artifactId": "art-1", "name": "result", "parts": [{"text": "42"}]},
        last_chunk=True,
    )
    services.task_transition(task_id=made["done"], to_state=TaskState.COMPLETED)
    made["beta"] = task_create(agent=beta, owner="anonymous", message=user_message("c")).pk
    # Registered through the protocol as a client does (in process: the test's DNS answers
    # for client.example.org), so the rebind's notices can name the agent's JWKS.
    push = {
        "id": "cfg-1",
        "url": f"{V1}t",
        "token": SECRETS[0],
        "authentication": {"scheme": "Bearer", "credentials": SECRETS[1]},
    }
    orphan = Task.objects.get(pk=protocol_push.open_task(alpha, push=push, text="d"))
    services.task_transition(task_id=orphan.pk, to_state=TaskState.WORKING)
    rebind = rebind_start(RebindRequest(agent=alpha, move_from=V1, move_to=V2), actor="test")
    rebind_cutover(rebind.pk, actor="test")
    made["orphan"] = orphan.pk
    made["rebind"] = rebind.pk
    return {k: str(v) for k, v in made.items()}


def _ids(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [t["id"] for t in answer.json()["results"]]


def test_tasks_filter_by_agent_state_context_orphaned_and_updated_since(store, tokens):
    api = tokens.client("read")
    everything = _ids(api.get("/api/v1/tasks/"))
    assert sorted(everything) == sorted(
        store[k] for k in ("wired", "working", "done", "beta", "orphan")
    )
    assert sorted(_ids(api.get("/api/v1/tasks/", params={"agent": "beta"}))) == [store["beta"]]
    working = {store["working"], store["orphan"]}
    assert set(_ids(api.get("/api/v1/tasks/", params={"state": "working"}))) == working
    assert set(_ids(api.get("/api/v1/tasks/", params={"state": "TASK_STATE_WORKING"}))) == working
    by_context = _ids(api.get("/api/v1/tasks/", params={"contextId": "ctx-1"}))
    assert sorted(by_context) == sorted([store["working"], store["done"]])
    assert _ids(api.get("/api/v1/tasks/", params={"orphaned": "true"})) == [store["orphan"]]
    # every other task, with or without push channels (no mark at all is not orphaned)
    not_orphaned = _ids(api.get("/api/v1/tasks/", params={"orphaned": "false"}))
    assert sorted(not_orphaned) == sorted(store[k] for k in ("wired", "working", "done", "beta"))
    # A task written to after a moment is listed from then on; the others are not.
    moment = dt.datetime.now(dt.UTC)
    assert _ids(api.get("/api/v1/tasks/", params={"updatedSince": moment.isoformat()})) == []
    services.task_transition(task_id=store["working"], to_state=TaskState.COMPLETED)
    since = _ids(api.get("/api/v1/tasks/", params={"updatedSince": moment.isoformat()}))
    assert since == [store["working"]]
    combined = api.get("/api/v1/tasks/", params={"agent": "alpha", "state": "completed"})
    assert sorted(_ids(combined)) == sorted([store["working"], store["done"]])


def test_a_list_row_says_what_the_task_is(store, tokens):
    api = tokens.client("read")
    rows = {t["id"]: t for t in api.get("/api/v1/tasks/").json()["results"]}
    row = rows[store["orphan"]]
    assert (row["agent"], row["state"], row["orphaned"]) == ("alpha", "TASK_STATE_WORKING", True)
    # a boolean on every row, as the schema says (the others are not orphaned)
    others = ("wired", "working", "done", "beta")
    assert {k: rows[store[k]]["orphaned"] for k in others} == dict.fromkeys(others, False)
    assert api.get(f"/api/v1/tasks/{store['beta']}").json()["orphaned"] is False
    assert rows[store["wired"]]["owner"] != "anonymous"  # the API key's principal opened it
    assert rows[store["done"]]["contextId"] == "ctx-1"


def test_cursor_pages_in_every_ordering_list_each_task_once(store, tokens):
    api = tokens.client("read")
    for ordering in ("-updatedAt", "updatedAt", "createdAt", "-statusTimestamp"):
        seen, url, params = [], "/api/v1/tasks/", {"pageSize": 2, "ordering": ordering}
        while url:
            answer = api.get(url, params=params)
            assert answer.status_code == 200, answer.text
            page = answer.json()
            assert len(page["results"]) <= 2
            seen += [t["id"] for t in page["results"]]
            url, params = page["next"], None
        assert len(seen) == len(set(seen)) == 5, (ordering, seen)
        assert set(seen) == {store[k] for k in ("wired", "working", "done", "beta", "orphan")}
    newest_first = _ids(api.get("/api/v1/tasks/", params={"ordering": "-createdAt"}))
    oldest_first = _ids(api.get("/api/v1/tasks/", params={"ordering": "createdAt"}))
    assert newest_first == oldest_first[::-1]


def test_a_task_reads_with_history_artifacts_and_its_channel_history(store, tokens):
    api = tokens.client("read")
    done = api.get(f"/api/v1/tasks/{store['done']}")
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["status"]["state"] == "TASK_STATE_COMPLETED"
    assert [m["parts"] for m in body["history"]] == [[{"text": "b"}]]
    assert body["artifacts"] == [
        {"artifactId": "art-1", "name": "result", "parts": [{"text": "42"}]}
    ]
    assert body["channelHistory"] == {"versions": [], "moves": [], "notices": []}

    answer = api.get(f"/api/v1/tasks/{store['orphan']}")
    assert answer.status_code == 200, answer.text
    for secret in SECRETS:
        assert secret not in answer.text
    history = answer.json()["channelHistory"]
    versions = [(v["channel"], v["status"], v["url"]) for v in history["versions"]]
    assert versions == [("cfg-1.v1", "retired", f"{V1}t"), ("cfg-1.v2", "waiting", f"{V2}t")]
    assert all(v["token"] == "set" for v in history["versions"])
    assert all(
        v["authentication"] == {"scheme": "Bearer", "credentials": "set"}
        for v in history["versions"]
    )
    [move] = history["moves"]
    assert (move["rebindId"], move["state"], move["fromVersion"], move["toVersion"]) == (
        store["rebind"],
        "orphaned",
        1,
        2,
    )
    kinds = {n["id"]: (n["kind"], n["version"]) for n in history["notices"]}
    assert kinds[move["notice"]] == ("channel-orphaned", 1)
    assert answer.json()["orphaned"] is True
    assert answer.json()["metadata"]["urn:a2a-platform:ext:push-channel:v1"]["orphaned"] is True


def test_reading_tasks_needs_the_view_permission_in_scope_and_user(store, tokens, http):
    assert http.get("/api/v1/tasks/").status_code == 401
    bad = http.get("/api/v1/tasks/", headers={"Authorization": "Bearer a2apt_nope_nope"})
    assert bad.status_code == 401
    assert bad.json()["error"]["code"]
    for scope in ("read", "operate", "rebind"):
        assert tokens.client(scope).get("/api/v1/tasks/").status_code == 200, scope
    bare = tokens.user("bare", group=None)
    refused = tokens.client("rebind", name="bare", user=bare).get("/api/v1/tasks/")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "permission_denied"
    outsider = tokens.user("outsider", staff=False)
    assert (
        tokens.client("read", name="outsider", user=outsider)
        .get(f"/api/v1/tasks/{store['done']}")
        .status_code
        == 403
    )


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"agent": "al\x00pha"}, "agent"),
        ({"contextId": "c\x00"}, "contextId"),
        ({"state": "bogus"}, "state"),
        ({"orphaned": "perhaps"}, "orphaned"),
        ({"updatedSince": "yesterday"}, "updatedSince"),
        ({"updatedSince": "9999-12-31T23:59:59-14:00"}, "updatedSince"),  # year 10000 in UTC
        ({"updatedSince": "0001-01-01T00:00:00+14:00"}, "updatedSince"),  # year 0 in UTC
        ({"ordering": "owner"}, "ordering"),
        ({"ordering": "-metadata"}, "ordering"),
        ({"cursor": "%%%not-base64"}, "cursor"),
        # well-formed cursors this list never handed out: positions the column cannot hold
        ({"cursor": _cursor("p=zz")}, "cursor"),
        ({"cursor": _cursor("r=1&p=2026-13-45 10:00:00+00:00")}, "cursor"),
        ({"cursor": _cursor("p=\x00")}, "cursor"),
        ({"cursor": _cursor("o=3&p=" + "9" * 400)}, "cursor"),
        ({"cursor": _cursor("p=zz"), "ordering": "createdAt"}, "cursor"),
        ({"pageSize": "1000000000"}, "pageSize"),
        ({"pageSize": "-3"}, "pageSize"),
        ({"agent": "a" * 65}, "agent"),
    ],
)
def test_hostile_list_input_is_a_400_naming_the_parameter(store, tokens, query, field):
    answer = tokens.client("read").get("/api/v1/tasks/", params=query)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert field in error.get("fields", {}) or error.get("field") == field, error


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/tasks/not-a-uuid", 400),
        ("/api/v1/tasks/%00", 400),
        ("/api/v1/tasks/00000000-0000-0000-0000-000000000000", 404),
        ("/api/v1/tasks/" + "9" * 5000, 400),
    ],
)
def test_a_bad_or_unknown_task_id_is_a_400_or_404_in_the_error_shape(store, tokens, path, status):
    answer = tokens.client("read").get(path)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["code"] == ("not_found" if status == 404 else "invalid_request")


def test_the_list_writes_nothing(store, tokens):
    """Reads only: no method but GET (and HEAD, OPTIONS) is routed to a task."""
    api = tokens.client("operate")
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        answer = api.request(method, f"/api/v1/tasks/{store['working']}")
        assert answer.status_code == 405, (method, answer.text)
        assert answer.json()["error"]["code"]
    assert Task.objects.get(pk=store["working"]).state == TaskState.WORKING
