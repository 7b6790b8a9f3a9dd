"""The official a2a-sdk client against the live platform: uvicorn + a Celery worker.

Every operation the card advertises, through the SDK's own transports: JSON-RPC and
HTTP+JSON at protocol 1.0 (picked by ClientFactory from the resolved card), and the SDK's
v0.3 compat transports (picked by ClientFactory from the card's 0.3 interfaces). The agents
run the deterministic `scripted` executor (tasks/executors/scripted.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from a2a.client import (
    A2ACardResolver,
    A2AClientError,
    AuthInterceptor,
    Client,
    ClientCallContext,
    ClientConfig,
    ClientFactory,
    CredentialService,
)
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.client.transports.rest import RestTransport
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
from a2a.compat.v0_3.rest_transport import CompatRestTransport
from a2a.types import a2a_pb2
from a2a.utils.constants import TransportProtocol
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

JSONRPC = TransportProtocol.JSONRPC.value
HTTP_JSON = TransportProtocol.HTTP_JSON.value
BINDINGS = [JSONRPC, HTTP_JSON]
TRANSPORT_OF = {
    ("1.0", JSONRPC): JsonRpcTransport,
    ("1.0", HTTP_JSON): RestTransport,
    ("0.3", JSONRPC): CompatJsonRpcTransport,
    ("0.3", HTTP_JSON): CompatRestTransport,
}

S = a2a_pb2.TaskState
COMPLETED = S.TASK_STATE_COMPLETED


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())


def user_message(text: str, *, task_id: str = "", context_id: str = "") -> a2a_pb2.Message:
    return a2a_pb2.Message(
        message_id=str(uuid.uuid4()),
        role=a2a_pb2.ROLE_USER,
        parts=[a2a_pb2.Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )


def texts(parts) -> list[str]:
    return [p.text for p in parts]


# --- Client plumbing -----------------------------------------------------------------------


class Wire:
    """What went over HTTP: each response's request headers, status and JSON body."""

    def __init__(self) -> None:
        self.exchanges: list[tuple[httpx.Request, int, Any]] = []

    async def hook(self, response: httpx.Response) -> None:
        await response.aread()
        try:
            body = response.json()
        except ValueError:
            body = None
        self.exchanges.append((response.request, response.status_code, body))

    @property
    def last(self) -> tuple[httpx.Request, int, Any]:
        return self.exchanges[-1]


class KeyCredentials(CredentialService):
    """Hands the SDK's AuthInterceptor one API key, for the card's scheme of that name."""

    def __init__(self, scheme: str, token: str) -> None:
        self.scheme, self.token = scheme, token

    async def get_credentials(self, security_scheme_name: str, context) -> str | None:
        return self.token if security_scheme_name == self.scheme else None


def only_interfaces(card: a2a_pb2.AgentCard, version: str) -> a2a_pb2.AgentCard:
    """The card as a client that only speaks `version` sees it."""
    chosen = [i for i in card.supported_interfaces if i.protocol_version == version]
    assert chosen, f"the card has no {version} interface"
    narrowed = a2a_pb2.AgentCard()
    narrowed.CopyFrom(card)
    del narrowed.supported_interfaces[:]
    narrowed.supported_interfaces.extend(chosen)
    return narrowed


@asynccontextmanager
async def connect(
    url: str,
    binding: str,
    *,
    version: str = "1.0",
    token: str | None = None,
    interceptors: list | None = None,
    wire: Wire | None = None,
) -> AsyncIterator[Client]:
    """An SDK client for the agent whose card is at `url`, on `binding` and `version`.

    The card is resolved from the live server; a 1.0 client lets ClientFactory pick from
    all interfaces (it prefers 1.0), a 0.3 client sees only the 0.3 ones, so ClientFactory
    builds the SDK's compat transport. `token` travels as a Bearer header on every request.
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    hooks = {"response": [wire.hook]} if wire else {}
    async with httpx.AsyncClient(headers=headers, timeout=30, event_hooks=hooks) as http:
        factory = ClientFactory(
            # Streaming has its own tests (test_streaming_live.py): one answer per call here.
            ClientConfig(streaming=False, supported_protocol_bindings=[binding], httpx_client=http)
        )
        if version == "1.0":
            client = await factory.create_from_url(url, interceptors=interceptors)
        else:
            card = await A2ACardResolver(http, url).get_agent_card()
            client = factory.create(only_interfaces(card, version), interceptors)
        assert type(client._transport) is TRANSPORT_OF[version, binding]
        try:
            yield client
        finally:
            await client.close()


async def send(
    client: Client,
    message: a2a_pb2.Message,
    *,
    return_immediately: bool = False,
    history_length: int | None = None,
) -> a2a_pb2.StreamResponse:
    request = a2a_pb2.SendMessageRequest(message=message)
    if return_immediately:
        request.configuration.return_immediately = True
    if history_length is not None:
        request.configuration.history_length = history_length
    # The client is configured without streaming: one SendMessage, its result as one event.
    events = [event async for event in client.send_message(request)]
    assert len(events) == 1, events
    return events[0]


async def send_task(client: Client, text: str, **kw) -> a2a_pb2.Task:
    response = await send(client, user_message(text), **kw)
    assert response.HasField("task"), response
    return response.task


async def get_task(client: Client, task_id: str, history_length: int | None = None):
    request = a2a_pb2.GetTaskRequest(id=task_id)
    if history_length is not None:
        request.history_length = history_length
    return await client.get_task(request)


async def poll_until(client: Client, task_id: str, state: int, timeout: float = 20):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        task = await get_task(client, task_id)
        seen.append(task.status.state)
        if task.status.state == state:
            return task, seen
        await asyncio.sleep(0.1)
    raise TimeoutError(f"task {task_id} not {S.Name(state)} in {timeout}s (saw {seen[-5:]})")


# --- Targets: the default agent at the origin root, a tenant agent at /<slug> ---------------


@pytest.fixture(params=["root", "tenant"])
def target(request, live_platform) -> str:
    """The URL the agent's card is resolved from."""
    agent = request.getfixturevalue("default_agent" if request.param == "root" else "tenant_agent")
    return live_platform.agent_url(agent)


@pytest.mark.parametrize("binding", BINDINGS)
def test_card_resolution_picks_the_v1_interface(
    live_platform, default_agent, tenant_agent, binding
):
    """The root card and a tenant card both resolve; the SDK picks the 1.0 interface of the
    binding it speaks, at the agent's own URL (no tenant field to echo)."""

    async def scenario():
        for agent, base in (
            (default_agent, f"{live_platform.url}/"),
            (tenant_agent, f"{live_platform.url}/{tenant_agent.slug}"),
        ):
            async with httpx.AsyncClient() as http:
                card = await A2ACardResolver(http, live_platform.agent_url(agent)).get_agent_card()
            assert card.name == agent.name
            assert card.capabilities.streaming  # this instance's event hub is connected
            assert card.capabilities.push_notifications  # delivery is durable (webhooks app)
            interfaces = {
                (i.protocol_binding, i.protocol_version): i for i in card.supported_interfaces
            }
            assert interfaces[binding, "1.0"].url == base
            assert interfaces[binding, "0.3"].url == base.rstrip("/") + "/v0.3"
            assert not any(i.tenant for i in card.supported_interfaces)
            async with connect(live_platform.agent_url(agent), binding) as client:
                assert client._transport.url.rstrip("/") == base.rstrip("/")

    run(scenario)


# --- SendMessage / GetTask / CancelTask on both bindings, root and tenant ------------------


@pytest.mark.parametrize("binding", BINDINGS)
def test_send_message_blocking_returns_the_completed_task(target, binding):
    async def scenario():
        async with connect(target, binding) as client:
            task = await send_task(client, "chunks 3")
            assert task.status.state == COMPLETED
            assert task.id
            assert task.context_id
            chunks, echo = task.artifacts
            assert chunks.name == "chunks"
            assert texts(chunks.parts) == ["chunk 1 of 3", "chunk 2 of 3", "chunk 3 of 3"]
            assert echo.name == "echo"
            assert texts(echo.parts) == ["chunks 3"]
            assert [m.role for m in task.history] == [a2a_pb2.ROLE_USER]
            assert task.history[0].task_id == task.id
            assert task.history[0].context_id == task.context_id
            # The same task is there to fetch afterwards.
            again = await get_task(client, task.id)
            assert again.status.state == COMPLETED
            assert again.artifacts == task.artifacts

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_send_message_return_immediately_then_poll(target, binding):
    async def scenario():
        async with connect(target, binding) as client:
            task = await send_task(client, "work 1", return_immediately=True)
            # The task as this very call created it, before any worker saw it.
            assert task.status.state == S.TASK_STATE_SUBMITTED
            assert not task.artifacts
            done, seen = await poll_until(client, task.id, COMPLETED)
            assert seen[0] != COMPLETED  # "work 1" stays WORKING for a second
            assert S.TASK_STATE_WORKING in seen
            assert texts(done.artifacts[-1].parts) == ["work 1"]

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_multi_turn_input_required_then_completed(target, binding):
    async def scenario():
        async with connect(target, binding) as client:
            task = await send_task(client, "ask")
            assert task.status.state == S.TASK_STATE_INPUT_REQUIRED
            assert task.status.message.role == a2a_pb2.ROLE_AGENT
            assert texts(task.status.message.parts) == ["Please send more input."]
            reply = user_message("here is more", task_id=task.id, context_id=task.context_id)
            response = await send(client, reply)
            done = response.task
            assert done.id == task.id
            assert done.context_id == task.context_id
            assert done.status.state == COMPLETED
            assert texts(done.artifacts[-1].parts) == ["here is more"]
            user_texts = [texts(m.parts) for m in done.history if m.role == a2a_pb2.ROLE_USER]
            assert user_texts == [["ask"], ["here is more"]]

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_message_script_answers_with_a_message(target, binding):
    async def scenario():
        async with connect(target, binding) as client:
            response = await send(client, user_message("message"))
            assert response.HasField("message"), response
            assert not response.HasField("task")
            assert response.message.role == a2a_pb2.ROLE_AGENT
            assert texts(response.message.parts) == ["message"]
            assert response.message.message_id

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_get_task_history_length(target, binding):
    async def scenario():
        async with connect(target, binding) as client:
            task = await send_task(client, "ask")
            reply = user_message("second", task_id=task.id, context_id=task.context_id)
            assert (await send(client, reply)).task.status.state == COMPLETED
            full = await get_task(client, task.id)
            user_texts = [texts(m.parts) for m in full.history if m.role == a2a_pb2.ROLE_USER]
            assert user_texts == [["ask"], ["second"]]
            newest = await get_task(client, task.id, history_length=1)
            assert list(newest.history) == [full.history[-1]]
            two = await get_task(client, task.id, history_length=2)
            assert list(two.history) == list(full.history[-2:])
            none = await get_task(client, task.id, history_length=0)
            assert not none.history
            assert none.status.state == COMPLETED
            # SendMessage honours historyLength too.
            short = await send_task(client, "hello", history_length=0)
            assert short.status.state == COMPLETED
            assert not short.history

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_cancel_task(target, binding):
    async def scenario():
        async with connect(target, binding) as client:
            task = await send_task(client, "work 30", return_immediately=True)
            canceled = await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
            assert canceled.id == task.id
            assert canceled.status.state == S.TASK_STATE_CANCELED
            assert (await get_task(client, task.id)).status.state == S.TASK_STATE_CANCELED
            with pytest.raises(TaskNotCancelableError) as second:
                await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
            assert second.value.data == {"state": "TASK_STATE_CANCELED"}
            with pytest.raises(TaskNotFoundError):
                await client.cancel_task(a2a_pb2.CancelTaskRequest(id=str(uuid.uuid4())))

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_unknown_task_is_task_not_found(target, binding):
    async def scenario():
        async with connect(target, binding) as client:
            missing = str(uuid.uuid4())
            with pytest.raises(TaskNotFoundError) as exc:
                await get_task(client, missing)
            assert exc.value.data == {"taskId": missing}
            with pytest.raises(TaskNotFoundError):
                await send(client, user_message("more", task_id=missing))

    run(scenario)


# A public address (nothing here connects to it: the registration checks it, a delivery to
# it would fail and be retried, which these tests do not wait for).
HOOK_URL = "https://93.184.216.34/hooks/a2a"


@pytest.mark.parametrize("binding", BINDINGS)
def test_push_notification_configs_created_read_listed_and_deleted(target, binding):
    async def scenario():
        async with connect(target, binding) as client:
            task = await send_task(client, "work 30", return_immediately=True)
            configs = []
            for n in (1, 2):
                config = a2a_pb2.TaskPushNotificationConfig(
                    task_id=task.id, id=f"cfg-{n}", url=f"{HOOK_URL}/{n}", token=f"tok-{n}"
                )
                created = await client.create_task_push_notification_config(config)
                assert (created.task_id, created.id, created.url) == (
                    task.id,
                    config.id,
                    config.url,
                )
                configs.append(created)
            got = await client.get_task_push_notification_config(
                a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task.id, id="cfg-2")
            )
            assert (got.id, got.url) == ("cfg-2", f"{HOOK_URL}/2")
            listed = await client.list_task_push_notification_configs(
                a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
            )
            assert sorted(c.id for c in listed.configs) == ["cfg-1", "cfg-2"]
            await client.delete_task_push_notification_config(
                a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="cfg-1")
            )
            listed = await client.list_task_push_notification_configs(
                a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task.id)
            )
            assert [c.id for c in listed.configs] == ["cfg-2"]
            # A deleted config is not found, as the SDK's own server answers.
            with pytest.raises(TaskNotFoundError):
                await client.get_task_push_notification_config(
                    a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task.id, id="cfg-1")
                )
            # Another task's id: not found, whatever the URL.
            with pytest.raises(TaskNotFoundError):
                await client.create_task_push_notification_config(
                    a2a_pb2.TaskPushNotificationConfig(
                        task_id=str(uuid.uuid4()), id="cfg-x", url=HOOK_URL
                    )
                )
            await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))

    run(scenario)


# --- An api_key agent: ListTasks, principals, the extended card ----------------------------


@pytest.mark.parametrize("binding", BINDINGS)
def test_list_tasks_pages_newest_first(live_platform, keyed_agent, binding):
    url = live_platform.agent_url(keyed_agent.agent)

    async def scenario():
        async with connect(url, binding, token=keyed_agent.token) as client:
            created = [(await send_task(client, f"task {i}")).id for i in range(5)]
            seen: list[str] = []
            pages = []
            token = ""
            while True:
                page = await client.list_tasks(
                    a2a_pb2.ListTasksRequest(page_size=2, page_token=token)
                )
                assert page.page_size == 2
                assert page.total_size == 5
                assert all(not t.artifacts for t in page.tasks)  # includeArtifacts absent
                assert all(t.status.state == COMPLETED for t in page.tasks)
                pages.append(len(page.tasks))
                seen += [t.id for t in page.tasks]
                token = page.next_page_token
                if not token:
                    break
            assert pages == [2, 2, 1]
            assert seen == created[::-1]  # each once, newest status first
            with_artifacts = await client.list_tasks(
                a2a_pb2.ListTasksRequest(page_size=1, include_artifacts=True)
            )
            assert [t.id for t in with_artifacts.tasks] == [created[-1]]
            assert texts(with_artifacts.tasks[0].artifacts[0].parts) == ["task 4"]
        # Another principal of the same agent sees none of them.
        async with connect(url, binding, token=keyed_agent.other_token) as other:
            page = await other.list_tasks(a2a_pb2.ListTasksRequest())
            assert list(page.tasks) == []
            assert page.total_size == 0
            assert page.next_page_token == ""

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_another_principals_task_is_not_found(live_platform, keyed_agent, binding):
    url = live_platform.agent_url(keyed_agent.agent)

    async def scenario():
        async with connect(url, binding, token=keyed_agent.token) as owner:
            task = await send_task(owner, "ask")
        async with connect(url, binding, token=keyed_agent.other_token) as other:
            with pytest.raises(TaskNotFoundError):
                await get_task(other, task.id)
            with pytest.raises(TaskNotFoundError):
                await other.cancel_task(a2a_pb2.CancelTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                await send(other, user_message("hijack", task_id=task.id))
        async with connect(url, binding, token=keyed_agent.token) as owner:
            still = await get_task(owner, task.id)
            assert still.status.state == S.TASK_STATE_INPUT_REQUIRED

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("scheme", ["bearer", "apiKey"])
def test_extended_agent_card_through_the_auth_interceptor(
    live_platform, keyed_agent, binding, scheme
):
    """The SDK's AuthInterceptor reads the card's security schemes and attaches the key
    (Authorization: Bearer for `bearer`, X-API-Key for `apiKey`)."""
    url = live_platform.agent_url(keyed_agent.agent)
    interceptor = AuthInterceptor(KeyCredentials(scheme, keyed_agent.token))
    wire = Wire()

    async def scenario():
        async with connect(url, binding, interceptors=[interceptor], wire=wire) as client:
            card = await client.get_extended_agent_card(
                a2a_pb2.GetExtendedAgentCardRequest(), context=ClientCallContext()
            )
            request, status, _ = wire.last
            assert status == 200
            if scheme == "bearer":
                assert request.headers["authorization"] == f"Bearer {keyed_agent.token}"
            else:
                assert request.headers["x-api-key"] == keyed_agent.token
            assert card.name == keyed_agent.agent.name
            assert card.capabilities.extended_agent_card
            assert set(card.security_schemes) == {"bearer", "apiKey"}
            assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
            assert card.security_schemes["apiKey"].api_key_security_scheme.name == "X-API-Key"
            # The same interceptor authenticates the task operations.
            task = await send_task(client, "hello", history_length=0)
            assert task.status.state == COMPLETED

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_api_key_agent_refuses_anonymous_and_bad_keys(live_platform, keyed_agent, binding):
    url = live_platform.agent_url(keyed_agent.agent)

    async def scenario():
        for token in (None, "a2a_000000000000_not-a-key"):
            async with connect(url, binding, token=token) as client:
                with pytest.raises(A2AClientError, match="HTTP Error 401"):
                    await client.get_extended_agent_card(a2a_pb2.GetExtendedAgentCardRequest())
                with pytest.raises(A2AClientError, match="HTTP Error 401"):
                    await client.list_tasks(a2a_pb2.ListTasksRequest())

    run(scenario)


# --- The SDK's v0.3 client ------------------------------------------------------------------


def v03_task(binding: str, body: dict) -> dict:
    """The task in a v0.3 response body: bare (JSON-RPC result) or wrapped (ProtoJSON)."""
    return body["result"] if binding == JSONRPC else body


@pytest.mark.parametrize("binding", BINDINGS)
def test_v03_send_get_cancel(target, binding):
    wire = Wire()

    async def scenario():
        async with connect(target, binding, version="0.3", wire=wire) as client:
            assert client._transport.url.rstrip("/").endswith("/v0.3")

            # message/send (blocking): a completed task, in v0.3 shapes on the wire.
            task = await send_task(client, "chunks 2")
            request, status, body = wire.last
            assert status == 200
            assert request.headers["a2a-version"] == "0.3"
            if binding == JSONRPC:
                assert request.url.path.endswith("/v0.3")
                raw = body["result"]
                assert raw["kind"] == "task"
                assert raw["status"]["state"] == "completed"
                assert raw["artifacts"][0]["parts"][0] == {"kind": "text", "text": "chunk 1 of 2"}
                assert raw["history"][0]["role"] == "user"
            else:
                assert request.url.path.endswith("/v0.3/v1/message:send")
                raw = body["task"]
                assert raw["status"]["state"] == "TASK_STATE_COMPLETED"
                assert raw["artifacts"][0]["parts"][0] == {"text": "chunk 1 of 2"}
                assert raw["history"][0]["role"] == "ROLE_USER"
                assert raw["history"][0]["content"] == [{"text": "chunks 2"}]
            assert task.status.state == COMPLETED
            assert texts(task.artifacts[0].parts) == ["chunk 1 of 2", "chunk 2 of 2"]
            assert texts(task.artifacts[1].parts) == ["chunks 2"]

            # tasks/get, with historyLength.
            fetched = await get_task(client, task.id, history_length=1)
            _, _, body = wire.last
            raw = v03_task(binding, body)
            assert raw["id"] == task.id
            if binding == JSONRPC:
                assert raw["kind"] == "task"
                assert raw["status"]["state"] == "completed"
            else:
                assert raw["status"]["state"] == "TASK_STATE_COMPLETED"
            assert fetched.status.state == COMPLETED
            assert len(fetched.history) == 1

            # tasks/cancel on a working task, then again on the canceled one.
            working = await send_task(client, "work 30", return_immediately=True)
            assert working.status.state == S.TASK_STATE_SUBMITTED  # as this call created it
            canceled = await client.cancel_task(a2a_pb2.CancelTaskRequest(id=working.id))
            _, _, body = wire.last
            state = v03_task(binding, body)["status"]["state"]
            assert state == ("canceled" if binding == JSONRPC else "TASK_STATE_CANCELLED")
            assert canceled.status.state == S.TASK_STATE_CANCELED
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(a2a_pb2.CancelTaskRequest(id=working.id))
            with pytest.raises(TaskNotFoundError):
                await get_task(client, str(uuid.uuid4()))

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_v03_multi_turn_and_message(target, binding):
    async def scenario():
        async with connect(target, binding, version="0.3") as client:
            task = await send_task(client, "ask")
            assert task.status.state == S.TASK_STATE_INPUT_REQUIRED
            assert texts(task.status.message.parts) == ["Please send more input."]
            reply = user_message("more", task_id=task.id, context_id=task.context_id)
            done = (await send(client, reply)).task
            assert done.id == task.id
            assert done.status.state == COMPLETED
            assert texts(done.artifacts[-1].parts) == ["more"]

            response = await send(client, user_message("message"))
            assert response.HasField("message"), response
            assert response.message.role == a2a_pb2.ROLE_AGENT
            assert texts(response.message.parts) == ["message"]

    run(scenario)


def test_v03_reader_of_the_public_card(live_platform, keyed_agent):
    """One card URL serves both versions: a v0.3 reader (the SDK's v0.3 model) finds its
    url, transport, version and security schemes in the same JSON a 1.0 client reads."""
    url = live_platform.agent_url(keyed_agent.agent)

    async def scenario():
        async with httpx.AsyncClient() as http:
            response = await http.get(f"{url}/.well-known/agent-card.json")
        assert response.status_code == 200
        legacy = t03.AgentCard.model_validate(response.json())
        assert legacy.url == f"{url}/v0.3"
        assert legacy.preferred_transport == JSONRPC
        assert legacy.protocol_version == "0.3"
        assert [(i.transport, i.url) for i in legacy.additional_interfaces] == [
            (HTTP_JSON, f"{url}/v0.3")
        ]
        assert legacy.security_schemes["bearer"].root.scheme == "Bearer"
        assert legacy.security_schemes["apiKey"].root.name == "X-API-Key"
        assert legacy.security == [{"bearer": ["invoke"]}, {"apiKey": ["invoke"]}]
        assert legacy.supports_authenticated_extended_card

    run(scenario)


@pytest.mark.parametrize("binding", BINDINGS)
def test_v03_extended_agent_card(live_platform, keyed_agent, binding):
    url = live_platform.agent_url(keyed_agent.agent)

    async def scenario():
        async with connect(url, binding, version="0.3", token=keyed_agent.token) as client:
            card = await client.get_extended_agent_card(a2a_pb2.GetExtendedAgentCardRequest())
            assert card.name == keyed_agent.agent.name
            assert card.capabilities.extended_agent_card
            assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
            task = await send_task(client, "hello")
            assert task.status.state == COMPLETED

    run(scenario)
