"""Tasks and push configs made through the protocol, as a client makes them: the state a
rebind meets on the path users take (a binding's issuer, its endpoint row, the snapshot) is
the protocol's, never rows built by hand.

Both v1.0 bindings, in process (the ASGI app itself, as tests/integration/protocol's `wire`):

    task_id = open_task(agent, push={"id": "cfg-0", "url": url})             # JSON-RPC
    task_id = open_task(agent, push={...}, binding="rest")                   # HTTP+JSON
    register(agent, task_id, {"id": "cfg-0", "url": other})                  # re-register
    delete(agent, task_id, "cfg-0")

Against a live web process (tests/live.py), over HTTP, so a binding's issuer is that process's
URL (JSON-RPC; they mark the workers live as that process's readiness sees them):

    task_id = live_open_task(web.url, agent, push={"id": "cfg-0", "url": url})
    live_register(web.url, agent, task_id, {"id": "cfg-0", "url": other})

What a strict receiver checks of a channel notice (docs/webhooks-receiving.md, section 5):
`card_jwks_url(agent)` (or `card_jwks_url(agent, web_url=web.url)`) is the JWKS URL the card
advertises; `verified_notice(claim, agent)` verifies a claimed delivery with the agent's JWKS
and returns `webhooks.receiver.parse_channel_notice` of it.

Each raises AssertionError with the answer when the protocol refuses. The caller's test needs
a transactional database (the app's ORM calls run on other threads) and a live delivery
worker as readiness sees it (`tests.readiness_helpers.mark_workers_live`): without one, a
registration is refused, as it is for a client.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from agents.models import Agent
from agents.signing import jwks
from tasks.models import Task
from tests.factories import user_message
from tests.integration.protocol.conftest import Wire
from tests.readiness_helpers import mark_workers_live
from webhooks.receiver import ChannelNotice, WebhookVerifier, parse_channel_notice

JSONRPC, REST = "jsonrpc", "rest"
DELIVERY_EXTENSION_URI = "urn:a2a-platform:ext:webhook-delivery:v1"
_REST_HEADERS = {"Content-Type": "application/a2a+json", "A2A-Version": "1.0"}


def _base(agent: Agent) -> str:
    """The agent's URL path: the origin root for the default agent, else /<slug>."""
    return "" if agent.is_default else f"/{agent.slug}"


def _rpc(agent: Agent, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = Wire().rpc(method, params, path=_base(agent) or "/", headers={"A2A-Version": "1.0"})
    assert "result" in answer, f"{method} refused: {answer}"
    return answer["result"]


def _rest(agent: Agent, method: str, path: str, body: Any = None) -> dict[str, Any]:
    resp = Wire().request(method, _base(agent) + path, json=body, headers=_REST_HEADERS)
    assert resp.status_code < 300, f"{method} {path} refused: {resp.status_code} {resp.text}"
    return resp.json() if resp.content else {}


def open_task(
    agent: Agent, *, push: dict[str, Any] | None = None, binding: str = JSONRPC, text: str = "hi"
) -> str:
    """SendMessage (returnImmediately) with `push` as its inline push config; the task's id."""
    mark_workers_live()
    configuration: dict[str, Any] = {"returnImmediately": True}
    if push is not None:
        configuration["taskPushNotificationConfig"] = push
    params = {"message": user_message(text), "configuration": configuration}
    if binding == REST:
        result = _rest(agent, "POST", "/message:send", params)
    else:
        result = _rpc(agent, "SendMessage", params)
    return result["task"]["id"]


def register(
    agent: Agent, task_id: str | uuid.UUID, config: dict[str, Any], *, binding: str = JSONRPC
) -> dict[str, Any]:
    """CreateTaskPushNotificationConfig: a new config, or a re-registration of its id."""
    mark_workers_live()
    if binding == REST:
        return _rest(agent, "POST", f"/tasks/{task_id}/pushNotificationConfigs", config)
    return _rpc(agent, "CreateTaskPushNotificationConfig", {"taskId": str(task_id), **config})


def delete(agent: Agent, task_id: str | uuid.UUID, config_id: str, *, binding: str = JSONRPC):
    """DeleteTaskPushNotificationConfig."""
    if binding == REST:
        return _rest(agent, "DELETE", f"/tasks/{task_id}/pushNotificationConfigs/{config_id}")
    return _rpc(
        agent, "DeleteTaskPushNotificationConfig", {"taskId": str(task_id), "id": config_id}
    )


def task_with_push(agent: Agent, url: str, *, config_id: str = "cfg-0", **kw: Any) -> Task:
    """A task opened through the protocol with one push config at `url`: its row."""
    return Task.objects.get(pk=open_task(agent, push={"id": config_id, "url": url}, **kw))


# --- a live web process ----------------------------------------------------------------------


def live_base_url(web_url: str, agent: Agent) -> str:
    """The agent's base URL on a live web process (`web.url`): its JSON-RPC endpoint."""
    return f"{web_url}/" if agent.is_default else f"{web_url}/{agent.slug}"


def _live_rpc(web_url: str, agent: Agent, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    resp = httpx.post(
        live_base_url(web_url, agent), json=body, headers={"A2A-Version": "1.0"}, timeout=15
    )
    assert resp.status_code == 200, f"{method} refused: {resp.status_code} {resp.text}"
    answer = resp.json()
    assert "result" in answer, f"{method} refused: {answer}"
    return answer["result"]


def live_open_task(
    web_url: str,
    agent: Agent,
    *,
    push: dict[str, Any] | None = None,
    text: str = "hi",
    context_id: str | None = None,
) -> str:
    """SendMessage (returnImmediately) to the live web process, `push` inline (and the
    message's `contextId`, when given); the task's id."""
    mark_workers_live(web_url=web_url)
    configuration: dict[str, Any] = {"returnImmediately": True}
    if push is not None:
        configuration["taskPushNotificationConfig"] = push
    message = user_message(text, **({"contextId": context_id} if context_id else {}))
    params = {"message": message, "configuration": configuration}
    return _live_rpc(web_url, agent, "SendMessage", params)["task"]["id"]


def live_register(
    web_url: str, agent: Agent, task_id: str | uuid.UUID, config: dict[str, Any]
) -> dict[str, Any]:
    """CreateTaskPushNotificationConfig through the live web process."""
    mark_workers_live(web_url=web_url)
    params = {"taskId": str(task_id), **config}
    return _live_rpc(web_url, agent, "CreateTaskPushNotificationConfig", params)


# --- what a strict receiver reads of a notice ------------------------------------------------


def card_jwks_url(agent: Agent, *, web_url: str | None = None) -> str:
    """The JWKS URL the agent's card advertises (its webhook-delivery extension's
    `params.jwksUrl`), read from the card served in process or by the live web process at
    `web_url`."""
    if web_url is None:
        mark_workers_live()
        resp = Wire().request("GET", _base(agent) + "/.well-known/agent-card.json")
    else:
        mark_workers_live(web_url=web_url)  # a card is served once readiness passes
        base = live_base_url(web_url, agent).rstrip("/")
        resp = httpx.get(f"{base}/.well-known/agent-card.json", timeout=15)
    assert resp.status_code == 200, f"card: {resp.status_code} {resp.text}"
    extensions = resp.json()["capabilities"].get("extensions", [])
    [ext] = [e for e in extensions if e["uri"] == DELIVERY_EXTENSION_URI]
    return ext["params"]["jwksUrl"]


def verified_notice(claim: Any, agent: Agent) -> ChannelNotice:
    """A claimed delivery (webhooks.delivery.claim_record.DeliveryClaim: url, headers, body)
    verified as a strict receiver does, with the agent's JWKS and the URL it was sent to as the
    JWT's audience, then read with `parse_channel_notice`: its notice (AssertionError when it
    carries none; VerificationError when it does not verify or is malformed)."""
    delivery = WebhookVerifier(jwks=jwks(agent)).verify(
        claim.headers,
        claim.body,
        expected_audience=claim.url,
    )
    notice = parse_channel_notice(delivery)
    assert notice is not None, f"not a channel notice: {claim.body!r}"
    return notice
