"""Push-config operations through the protocol app (JSON-RPC and HTTP+JSON, in process).

The agent's executor is external, so no worker runs and nothing is delivered: these tests look
at what the operations answer and at the rows they write (configs, binding versions, the
outbox). DNS is the edge we do not own: `webhooks.delivery.ssrf.resolve` answers a public address
for the test host names.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from django.db import connection

from a2a_platform.lib.crypto import decrypt
from agents.card_render import PUSH_CHANNEL_URI
from agents.services import api_key_create
from tasks import services
from tasks.models import Task
from tasks.states import TaskState
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import user_message
from webhooks.delivery import ssrf
from webhooks.delivery.ssrf import parse_url
from webhooks.delivery.transport import TransportResult
from webhooks.models import Delivery, DeliveryState, Endpoint, PushBinding, PushConfig

pytestmark = pytest.mark.usefixtures("public_dns")

HOOK = "https://hooks.example.org/a2a"
SECRET = "cred-Zq81-not-for-your-eyes"
TOKEN = "tok-4b1d-for-the-receiver"


def _auth(key) -> dict:
    return {"Authorization": f"Bearer {key.token}"}


def _new_task(wire, key=None) -> str:
    params = {"message": user_message("hi"), "configuration": {"returnImmediately": True}}
    answer = wire.rpc("SendMessage", params, headers=_auth(key) if key else None)
    return answer["result"]["task"]["id"]


def _create(wire, task_id: str, key=None, **config) -> dict:
    params = {"taskId": task_id, "url": HOOK, **config}
    return wire.rpc("CreateTaskPushNotificationConfig", params, headers=_auth(key) if key else None)


def _violation(error: dict) -> str:
    return error["data"][1]["fieldViolations"][0]["field"]


def _row_counts() -> tuple[int, int, int, int]:
    return (
        PushConfig.objects.count(),
        PushBinding.objects.count(),
        Delivery.objects.count(),
        Endpoint.objects.count(),
    )


def _ok(status: int = 200) -> TransportResult:
    return TransportResult(
        status=status,
        headers={},
        body_excerpt="",
        duration_ms=1.0,
        error_class=None,
        retry_after=None,
    )


# --- Create / Get / List --------------------------------------------------------------------


def test_create_assigns_a_uuid_and_never_returns_credentials(wire, agent, key):
    task_id = _new_task(wire, key)
    created = _create(
        wire,
        task_id,
        key,
        token=TOKEN,
        authentication={"scheme": "Bearer", "credentials": SECRET},
    )["result"]
    assert uuid.UUID(created["id"])  # the server chose the id
    assert created == {
        "id": created["id"],
        "taskId": task_id,
        "url": HOOK,
        "token": TOKEN,
        "authentication": {"scheme": "Bearer"},
    }
    got = wire.rpc(
        "GetTaskPushNotificationConfig",
        {"taskId": task_id, "id": created["id"]},
        headers=_auth(key),
    )["result"]
    assert got == created
    rest = wire.request(
        "GET", f"/tasks/{task_id}/pushNotificationConfigs/{created['id']}", headers=_auth(key)
    )
    assert rest.status_code == 200
    assert rest.json() == created
    listed = wire.request("GET", f"/tasks/{task_id}/pushNotificationConfigs", headers=_auth(key))
    assert listed.json()["configs"] == [created]
    for text in (json.dumps(created), rest.text, listed.text):
        assert SECRET not in text
        assert "credentials" not in text


def test_secrets_are_encrypted_at_rest(wire, agent, key):
    task_id = _new_task(wire, key)
    _create(
        wire, task_id, key, token=TOKEN, authentication={"scheme": "Basic", "credentials": SECRET}
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM webhooks_pushbinding")
        rows = cursor.fetchall()
    assert len(rows) == 1
    for column in rows[0]:
        assert SECRET not in str(column)
        assert TOKEN not in str(column)
    binding = PushBinding.objects.get()
    assert binding.auth_scheme == "Basic"
    assert decrypt(binding.credentials_encrypted) == SECRET
    assert decrypt(binding.token_encrypted) == TOKEN


def test_create_with_client_id_over_rest(wire, agent, key):
    task_id = _new_task(wire, key)
    resp = wire.request(
        "POST",
        f"/tasks/{task_id}/pushNotificationConfigs",
        json={"id": "mine", "url": HOOK},
        headers=_auth(key),
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"id": "mine", "taskId": task_id, "url": HOOK}
    push = PushConfig.objects.get()
    assert (push.config_id, str(push.task_id), push.current_version) == ("mine", task_id, 1)


def test_get_unknown_config_is_task_not_found(wire, agent, key):
    task_id = _new_task(wire, key)
    error = wire.rpc(
        "GetTaskPushNotificationConfig", {"taskId": task_id, "id": "nope"}, headers=_auth(key)
    )["error"]
    assert error["code"] == -32001
    assert error["data"][0]["reason"] == "TASK_NOT_FOUND"
    rest = wire.request("GET", f"/tasks/{task_id}/pushNotificationConfigs/nope", headers=_auth(key))
    assert rest.status_code == 404
    assert rest.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"


def test_list_returns_every_live_config(wire, agent, key):
    task_id = _new_task(wire, key)
    other_task = _new_task(wire, key)
    a = _create(wire, task_id, key, id="a")["result"]
    b = _create(wire, task_id, key, id="b", url="https://other.example.org/b")["result"]
    _create(wire, other_task, key, id="elsewhere")
    listed = wire.rpc("ListTaskPushNotificationConfigs", {"taskId": task_id}, headers=_auth(key))[
        "result"
    ]
    assert listed == {"configs": [a, b], "nextPageToken": ""}
    empty = wire.rpc(
        "ListTaskPushNotificationConfigs", {"taskId": _new_task(wire, key)}, headers=_auth(key)
    )["result"]
    assert empty["configs"] == []


# --- Delete ---------------------------------------------------------------------------------


def test_delete_is_idempotent_and_cancels_what_the_config_still_owes(wire, agent, key):
    task_id = _new_task(wire, key)
    _create(wire, task_id, key, id="gone")
    keep = _create(wire, task_id, key, id="keep")["result"]
    services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
    gone = PushConfig.objects.get(config_id="gone")
    assert set(gone.deliveries.values_list("kind", "state")) == {
        ("snapshot", DeliveryState.PENDING),
        ("status", DeliveryState.PENDING),
    }

    for _ in range(2):  # the second delete of the same config succeeds too
        resp = wire.request(
            "DELETE", f"/tasks/{task_id}/pushNotificationConfigs/gone", headers=_auth(key)
        )
        assert resp.status_code == 200
        assert resp.json() == {}
    again = wire.rpc(
        "DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "gone"}, headers=_auth(key)
    )
    assert again["result"] == {}
    never = wire.rpc(
        "DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "never"}, headers=_auth(key)
    )
    assert never["result"] == {}

    gone.refresh_from_db()
    assert gone.deleted_at is not None
    assert set(gone.deliveries.values_list("state", flat=True)) == {DeliveryState.CANCELED}
    assert all(d.finished_at is not None for d in gone.deliveries.all())
    assert not gone.bindings.filter(retired_at__isnull=True).exists()
    # The other config is untouched, and the deleted one takes no new deliveries.
    services.task_transition(task_id=task_id, to_state=TaskState.COMPLETED)
    assert gone.deliveries.count() == 2
    assert (
        PushConfig.objects.get(config_id="keep")
        .deliveries.filter(state=DeliveryState.PENDING)
        .count()
        == 3
    )
    error = wire.rpc(
        "GetTaskPushNotificationConfig", {"taskId": task_id, "id": "gone"}, headers=_auth(key)
    )["error"]
    assert error["code"] == -32001
    listed = wire.rpc("ListTaskPushNotificationConfigs", {"taskId": task_id}, headers=_auth(key))[
        "result"
    ]
    assert listed["configs"] == [keep]


def test_delete_while_a_delivery_is_in_flight_stops_it(wire, agent, key):
    """The in-flight attempt may land, but its outcome must not bring the delivery back:
    a deleted config is never tried again."""
    task_id = _new_task(wire, key)
    _create(wire, task_id, key, id="busy")
    push = PushConfig.objects.get()
    claim = delivery_claim_head(config_pk=push.pk)
    assert claim is not None
    assert Delivery.objects.get(pk=claim.delivery_pk).state == DeliveryState.SENDING

    resp = wire.request(
        "DELETE", f"/tasks/{task_id}/pushNotificationConfigs/busy", headers=_auth(key)
    )
    assert resp.status_code == 200

    outcome = delivery_record(claim=claim, result=_ok(503))  # the receiver failed
    assert outcome.state == "stale"
    delivery = Delivery.objects.get(pk=claim.delivery_pk)
    assert delivery.state == DeliveryState.CANCELED
    assert delivery_claim_head(config_pk=push.pk) is None


# --- Rebinding (create with an existing id) ---------------------------------------------------


def _deliver_heads(push: PushConfig) -> list[str]:
    """Deliver the config's heads one by one until none is due; the kinds delivered."""
    kinds = []
    while (claim := delivery_claim_head(config_pk=push.pk)) is not None:
        kinds.append(Delivery.objects.get(pk=claim.delivery_pk).kind)
        delivery_record(claim=claim, result=_ok())
    return kinds


def test_create_with_an_existing_id_under_cutover_switches_to_version_two_at_once(wire, agent, key):
    agent.push_rebind_policy = "cutover"
    agent.save()
    task_id = _new_task(wire, key)
    _create(wire, task_id, key, id="cfg", token="t1")
    services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
    push = PushConfig.objects.get()
    v1 = push.bindings.get()
    owed_under_v1 = list(push.deliveries.order_by("id").values_list("pk", flat=True))
    assert len(owed_under_v1) == 2  # the snapshot and the WORKING status

    second = _create(wire, task_id, key, id="cfg", url="https://new.example.org/hook", token="t2")
    assert second["result"] == {
        "id": "cfg",
        "taskId": task_id,
        "url": "https://new.example.org/hook",
        "token": "t2",
    }
    push.refresh_from_db()
    assert push.current_version == 2
    bindings = list(push.bindings.order_by("version"))
    assert [(b.version, b.retired_at is None) for b in bindings] == [(1, False), (2, True)]
    assert (bindings[0].pk, bindings[0].url) == (v1.pk, HOOK)
    assert bindings[1].url == "https://new.example.org/hook"
    assert bindings[1].endpoint.origin == "https://new.example.org:443"
    # What v1 already owed is still owed through v1; the new snapshot and later events use v2.
    for pk in owed_under_v1:
        delivery = Delivery.objects.get(pk=pk)
        assert (delivery.binding_id, delivery.state) == (v1.pk, DeliveryState.PENDING)
    # The switch is announced on v1 first (a config's deliveries go in order), so a receiver
    # that trusts v1 learns v2 before v2's snapshot arrives (docs/rebinds.md).
    notice, snapshot = push.deliveries.exclude(pk__in=owed_under_v1).order_by("id")
    assert (notice.kind, notice.binding_id, notice.state) == ("notice", v1.pk, "pending")
    entry = json.loads(notice.body)["statusUpdate"]["metadata"][PUSH_CHANNEL_URI]
    assert (entry["notice"], entry["policy"], entry["newChannel"]["version"]) == (
        "channel-changed",
        "cutover",
        "cfg.v2",
    )
    assert (snapshot.kind, snapshot.binding_id, snapshot.seq) == ("snapshot", bindings[1].pk, 2)
    assert snapshot.state == DeliveryState.PENDING  # not held: v2 took over at once
    services.task_transition(task_id=task_id, to_state=TaskState.COMPLETED)
    latest = push.deliveries.latest("id")
    assert (latest.kind, latest.binding_id, latest.seq) == ("status", bindings[1].pk, 3)
    got = wire.rpc(
        "GetTaskPushNotificationConfig", {"taskId": task_id, "id": "cfg"}, headers=_auth(key)
    )["result"]
    assert got["url"] == "https://new.example.org/hook"
    assert PushConfig.objects.count() == 1


def test_create_with_an_existing_id_under_drain_moves_after_a_notice_on_version_one(
    wire, agent, key
):
    """The default policy: the client's re-registration of an in-flight task is a rebind of
    that task. v1 delivers what it owes, then a channel-changed notice; v2 (opened by a
    snapshot) and everything after wait, held, until that notice is delivered."""
    task_id = _new_task(wire, key)
    _create(wire, task_id, key, id="cfg", token="t1")
    services.task_transition(task_id=task_id, to_state=TaskState.WORKING)
    push = PushConfig.objects.get()
    v1 = push.bindings.get()

    second = _create(wire, task_id, key, id="cfg", url="https://new.example.org/hook", token="t2")
    assert second["result"]["url"] == "https://new.example.org/hook"
    push.refresh_from_db()
    v2 = push.bindings.get(version=2)
    v1.refresh_from_db()
    assert (v2.activated_at, v1.retired_at is not None) == (None, True)
    services.task_transition(task_id=task_id, to_state=TaskState.INPUT_REQUIRED)
    on_v1 = list(push.deliveries.filter(binding=v1).order_by("id").values_list("kind", "seq"))
    assert on_v1 == [("snapshot", 1), ("status", 2), ("notice", 2)]
    held = list(push.deliveries.filter(binding=v2).order_by("id").values_list("kind", "state"))
    assert held == [("snapshot", "held"), ("status", "held")]
    notice = json.loads(push.deliveries.get(kind="notice").body)["statusUpdate"]
    assert notice["status"]["state"] == "TASK_STATE_WORKING"  # the state, unchanged
    payload = notice["metadata"]["urn:a2a-platform:ext:push-channel:v1"]
    assert payload["notice"] == "channel-changed"
    assert payload["oldChannel"]["version"] == "cfg.v1"
    assert payload["newChannel"]["version"] == "cfg.v2"
    assert payload["newChannel"]["origin"] == "https://new.example.org:443"
    assert payload["fromSeq"] == 2  # the snapshot on v2 carries seq 2

    # v1 first (its two deliveries, then the notice), then v2 in order.
    assert _deliver_heads(push) == ["snapshot", "status", "notice", "snapshot", "status"]
    v2.refresh_from_db()
    assert v2.activated_at is not None
    assert set(push.deliveries.values_list("state", flat=True)) == {DeliveryState.DELIVERED}
    services.task_transition(task_id=task_id, to_state=TaskState.COMPLETED)
    assert push.deliveries.latest("id").binding_id == v2.pk


def test_config_cap_refuses_and_writes_nothing(wire, agent, key, settings):
    settings.A2A_WEBHOOK_MAX_CONFIGS_PER_TASK = 2
    task_id = _new_task(wire, key)
    _create(wire, task_id, key, id="one")
    _create(wire, task_id, key, id="two")
    before = _row_counts()
    error = _create(wire, task_id, key, id="three", url="https://third.example.org/")["error"]
    assert error["code"] == -32602
    assert "at most 2" in error["message"]
    assert _row_counts() == before
    assert not Endpoint.objects.filter(origin="https://third.example.org:443").exists()
    # Rebinding an existing config is not a new config; a deleted one frees its place.
    assert "result" in _create(wire, task_id, key, id="two", url="https://two.example.org/")
    wire.rpc(
        "DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "one"}, headers=_auth(key)
    )
    assert _create(wire, task_id, key, id="three")["result"]["id"] == "three"


# --- SSRF at registration -------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "https://127.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/hook",
        "http://2130706433/",
        "http://0x7f.1/",
        "ftp://hooks.example.org/drop",
        "https://user:pw@hooks.example.org/",
        "https://hooks.invalid/",
        "http://hooks.example.org/plain",
    ],
)
def test_unsafe_urls_are_refused_at_registration(wire, agent, key, settings, url):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = []
    task_id = _new_task(wire, key)
    before = _row_counts()
    error = _create(wire, task_id, key, url=url)["error"]
    assert error["code"] == -32602
    assert _violation(error) == "url"
    assert _row_counts() == before == (0, 0, 0, 0)
    # The same refusal inline in SendMessage: no task is accepted with its webhook refused.
    tasks = Task.objects.count()
    params = {
        "message": user_message("x"),
        "configuration": {"returnImmediately": True, "taskPushNotificationConfig": {"url": url}},
    }
    inline = wire.rpc("SendMessage", params, headers=_auth(key))["error"]
    assert inline["code"] == -32602
    assert _violation(inline) == "url"
    assert Task.objects.count() == tasks
    assert _row_counts() == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"token": "line\nbreak"}, "token"),
        ({"token": "t\u00f8ken"}, "token"),
        ({"token": "x" * 1025}, "token"),
        ({"authentication": {"scheme": "Bearer\n"}}, "authentication.scheme"),
        ({"authentication": {"scheme": "Bearer x"}}, "authentication.scheme"),
        (
            {"authentication": {"scheme": "Basic", "credentials": "a\r\nX-Evil: 1"}},
            "authentication.credentials",
        ),
        (
            {"authentication": {"scheme": "Basic", "credentials": "p\u00e4ss"}},
            "authentication.credentials",
        ),
    ],
)
def test_values_that_cannot_travel_in_a_header_are_refused(wire, agent, key, config, field):
    """Token, scheme and credentials are sent as request headers: a value no HTTP client can
    send would make every delivery of the config fail, so it is refused at registration."""
    task_id = _new_task(wire, key)
    error = _create(wire, task_id, key, **config)["error"]
    assert error["code"] == -32602
    assert _violation(error) == field
    assert _row_counts() == (0, 0, 0, 0)


@pytest.mark.parametrize(
    "config_id",
    ["r\u00e9union", "a\nb", "a/b", "a:b", "a b", "a%00b", ".", "..", "x" * 256],
)
def test_config_ids_that_cannot_travel_in_a_path_or_header_are_refused(wire, agent, key, config_id):
    """The id is a path segment of the REST binding and part of X-A2A-Binding-Version: an id
    a client could not address, or a header could not carry, is refused, not dead-lettered
    at every send."""
    task_id = _new_task(wire, key)
    error = _create(wire, task_id, key, id=config_id)["error"]
    assert error["code"] == -32602
    assert _violation(error) == "id"
    assert _row_counts() == (0, 0, 0, 0)


def test_every_accepted_config_id_is_addressable_over_rest(wire, agent, key):
    task_id = _new_task(wire, key)
    for config_id in ["Hook-1.v2_~", "...", "x" * 255]:
        assert _create(wire, task_id, key, id=config_id)["result"]["id"] == config_id
        path = f"/tasks/{task_id}/pushNotificationConfigs/{config_id}"
        got = wire.request("GET", path, headers=_auth(key))
        assert got.status_code == 200, (config_id, got.text)
        assert got.json()["id"] == config_id
        assert wire.request("DELETE", path, headers=_auth(key)).status_code == 200
    assert not PushConfig.objects.filter(deleted_at__isnull=True).exists()


def test_hostile_config_ids_in_rest_paths_are_not_found(wire, agent, key):
    """A NUL (or anything never stored) in the path is an unknown config, never a 500."""
    task_id = _new_task(wire, key)
    _create(wire, task_id, key, id="mine")
    before = _row_counts()
    for segment in ["a%00b", "%C3%A9", "%0A"]:
        path = f"/tasks/{task_id}/pushNotificationConfigs/{segment}"
        got = wire.request("GET", path, headers=_auth(key))
        assert got.status_code == 404, (segment, got.text)
        assert got.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
        assert wire.request("DELETE", path, headers=_auth(key)).status_code == 200  # idempotent
    assert _row_counts() == before


def test_a_non_ascii_url_path_is_accepted_and_sent_percent_encoded(wire, agent, key):
    task_id = _new_task(wire, key)
    url = "https://hooks.example.org/h\u00fck?q=\u00fc"
    assert _create(wire, task_id, key, url=url)["result"]["url"] == url
    claim = delivery_claim_head(config_pk=PushConfig.objects.get().pk)
    assert claim.url == url
    assert parse_url(claim.url).path_qs == "/h%C3%BCk?q=%C3%BC"  # the request line's target


@pytest.fixture
def slow_dns(monkeypatch):
    """slow.example.org takes 2 s to resolve; every lookup notes the thread it ran on."""
    threads: list[str] = []
    fast = ssrf.resolve

    def resolve(host: str, port: int) -> list[str]:
        threads.append(threading.current_thread().name)
        if host == "slow.example.org":
            time.sleep(2)
        return fast(host, port)

    monkeypatch.setattr(ssrf, "resolve", resolve)
    return threads


def test_registration_resolves_dns_off_the_orm_threads(wire, agent, key, slow_dns):
    """The URL's owner controls how long its lookup takes: it never holds one of the few
    ORM threads (or, for an inline config, SendMessage's open transaction)."""
    task_id = _new_task(wire, key)
    assert "result" in _create(wire, task_id, key)
    assert "result" in _send_with_push(wire, key, user_message("hi"))
    assert len(slow_dns) == 2
    assert not any(name.startswith("orm") for name in slow_dns), slow_dns


def test_a_lookup_past_the_deadline_refuses_the_registration(wire, agent, key, slow_dns, settings):
    settings.A2A_WEBHOOK_CHECK_TIMEOUT_SECONDS = 0.2
    task_id = _new_task(wire, key)
    tasks = Task.objects.count()
    error = _create(wire, task_id, key, url="https://slow.example.org/hook")["error"]
    assert (error["code"], _violation(error)) == (-32602, "url")
    assert "did not resolve within 0.2 s" in error["data"][1]["fieldViolations"][0]["description"]
    inline = _send_with_push(wire, key, user_message("x"), url="https://slow.example.org/h")
    assert _violation(inline["error"]) == "url"
    assert Task.objects.count() == tasks
    assert _row_counts() == (0, 0, 0, 0)


def test_loopback_is_accepted_when_allowlisted(wire, agent, key, settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    task_id = _new_task(wire, key)
    created = _create(wire, task_id, key, url="http://127.0.0.1:9/hook")["result"]
    assert created["url"] == "http://127.0.0.1:9/hook"
    assert PushBinding.objects.get().endpoint.origin == "http://127.0.0.1:9"
    # Still refused: the metadata service is not in the allowlist.
    error = _create(wire, task_id, key, url="http://169.254.169.254/")["error"]
    assert (error["code"], _violation(error)) == (-32602, "url")


# --- Visibility -----------------------------------------------------------------------------


def test_another_principals_task_is_not_found(wire, agent, key):
    other = api_key_create(agent=agent, name="other")
    task_id = _new_task(wire, key)
    _create(wire, task_id, key, id="mine")
    before = _row_counts()
    calls = [
        ("CreateTaskPushNotificationConfig", {"taskId": task_id, "url": HOOK}),
        ("GetTaskPushNotificationConfig", {"taskId": task_id, "id": "mine"}),
        ("ListTaskPushNotificationConfigs", {"taskId": task_id}),
        ("DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "mine"}),
    ]
    for headers in (_auth(other), None):  # another key, and an anonymous caller
        for method, params in calls:
            error = wire.rpc(method, params, headers=headers)["error"]
            assert error["code"] == -32001, (method, error)
    resp = wire.request(
        "DELETE", f"/tasks/{task_id}/pushNotificationConfigs/mine", headers=_auth(other)
    )
    assert resp.status_code == 404
    assert _row_counts() == before
    assert PushConfig.objects.get().deleted_at is None


def test_push_operations_need_the_capability(wire, agent, key):
    task_id = _new_task(wire, key)
    agent.push_notifications_enabled = False
    agent.save()
    error = _create(wire, task_id, key)["error"]
    assert error["code"] == -32003
    assert _row_counts() == (0, 0, 0, 0)


# --- Inline config in SendMessage ------------------------------------------------------------


def _send_with_push(wire, key, message: dict, **config) -> dict:
    params = {
        "message": message,
        "configuration": {
            "returnImmediately": True,
            "taskPushNotificationConfig": {"url": HOOK, **config},
        },
    }
    return wire.rpc("SendMessage", params, headers=_auth(key))


def test_inline_config_is_written_with_the_task(wire, agent, key):
    task = _send_with_push(wire, key, user_message("hi"), token=TOKEN)["result"]["task"]
    push = PushConfig.objects.get()
    assert str(push.task_id) == task["id"]
    assert uuid.UUID(push.config_id)
    binding = push.bindings.get()
    assert (binding.version, binding.url, decrypt(binding.token_encrypted)) == (1, HOOK, TOKEN)
    delivery = Delivery.objects.get()
    assert (delivery.kind, delivery.seq, delivery.state) == ("snapshot", 1, DeliveryState.PENDING)
    assert delivery.binding_id == binding.pk
    body = json.loads(delivery.body)
    assert body["task"]["id"] == task["id"]
    assert body["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    # The config is readable through the operations like any other.
    listed = wire.rpc(
        "ListTaskPushNotificationConfigs", {"taskId": task["id"]}, headers=_auth(key)
    )["result"]["configs"]
    assert listed == [{"id": push.config_id, "taskId": task["id"], "url": HOOK, "token": TOKEN}]


def test_an_empty_inline_config_is_refused_not_dropped(wire, agent, key):
    """`taskPushNotificationConfig: {}` names no URL: the send fails and writes nothing (it
    used to open the task without a webhook)."""
    params = {
        "message": user_message("hi"),
        "configuration": {"returnImmediately": True, "taskPushNotificationConfig": {}},
    }
    error = wire.rpc("SendMessage", params, headers=_auth(key))["error"]
    assert (error["code"], _violation(error)) == (-32602, "url")
    assert Task.objects.count() == 0
    assert _row_counts() == (0, 0, 0, 0)


def test_replayed_send_message_does_not_create_a_second_config(wire, agent, key):
    message = user_message("once")
    first = _send_with_push(wire, key, message)["result"]["task"]
    second = _send_with_push(wire, key, message)["result"]["task"]
    assert first["id"] == second["id"]
    assert Task.objects.count() == 1
    assert _row_counts() == (1, 1, 1, 1)
