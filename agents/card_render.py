"""Agent Card rendering from the Agent model (ProtoJSON of `lf.a2a.v1.AgentCard`).

Rendered through the official protobuf type, so a card that does not fit the schema fails
here, not in a client. No empty values are emitted (verifiers of signed cards disagree about
them, digest §10).
"""

from __future__ import annotations

from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import json_format

from agents.models import Agent, AuthMode

V03_SUFFIX = "/v0.3"
API_KEY_HEADER = "X-API-Key"


def agent_base_url(agent: Agent, origin: str, *, at_root: bool) -> str:
    """The one URL both v1.0 bindings of this agent live at (slug in the path, no tenant)."""
    origin = origin.rstrip("/")
    return f"{origin}/" if at_root else f"{origin}/{agent.slug}"


JWKS_PATH = "/.well-known/jwks.json"


def jwks_url(base: str) -> str:
    """The JWKS of the agent whose base URL (`agent_base_url`, or a webhook JWT's issuer) is
    `base`: what the card, its extensions and every channel notice name."""
    return base.split("/.well-known/", 1)[0].rstrip("/") + JWKS_PATH


def _skills(agent: Agent) -> list[dict[str, Any]]:
    if agent.skills:
        return agent.skills
    # A card needs at least one skill; describe the agent itself.
    return [
        {
            "id": agent.slug,
            "name": agent.name,
            "description": agent.description,
            "tags": [agent.executor],
        }
    ]


def security(agent: Agent) -> dict[str, Any]:
    if agent.auth_mode != AuthMode.API_KEY:
        return {}
    return {
        "securitySchemes": {
            "bearer": {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "description": "An API key of this agent as a bearer token",
                }
            },
            "apiKey": {
                "apiKeySecurityScheme": {
                    "location": "header",
                    "name": API_KEY_HEADER,
                    "description": "An API key of this agent",
                }
            },
        },
        # Alternatives: either scheme authenticates. API keys carry one implicit scope,
        # `invoke`, named so the card has no empty value (signed cards must not: verifiers
        # disagree about empties, docs/decisions.md).
        "securityRequirements": [
            {"schemes": {"bearer": {"list": ["invoke"]}}},
            {"schemes": {"apiKey": {"list": ["invoke"]}}},
        ],
    }


DELIVERY_EXTENSION_URI = "urn:a2a-platform:ext:webhook-delivery:v1"
# How the agent moves push channels while tasks are in flight (webhooks/rebinds/operations.py):
# declared in the card, the key of channel notices' metadata and of an orphaned task's mark.
PUSH_CHANNEL_URI = "urn:a2a-platform:ext:push-channel:v1"


def delivery_extension(agent: Agent, origin: str, *, at_root: bool) -> dict[str, Any]:
    """How this platform delivers push notifications, declared for clients (data only)."""
    base = agent_base_url(agent, origin, at_root=at_root)
    return {
        "uri": DELIVERY_EXTENSION_URI,
        "description": "Push notifications are durable and at-least-once, signed (Standard "
        "Webhooks v1a, Ed25519), ordered per task by X-A2A-Task-Seq",
        "params": {
            "guarantee": "durable, at-least-once",
            "jwksUrl": jwks_url(base),
            "signature": "webhook-signature v1a (Ed25519) over webhook-id.webhook-timestamp.body",
            "dedupeHeader": "webhook-id",
            "orderHeader": "X-A2A-Task-Seq",
            "bindingHeader": "X-A2A-Binding-Version",
        },
    }


def render_card(
    agent: Agent,
    *,
    origin: str,
    at_root: bool = False,
    capabilities: dict[str, bool] | None = None,
    platform_extensions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    base = agent_base_url(agent, origin, at_root=at_root)
    v03 = base.rstrip("/") + V03_SUFFIX
    caps = {
        "streaming": False,
        "pushNotifications": agent.push_notifications_enabled,
        **(capabilities or {}),
    }
    caps["extendedAgentCard"] = agent.auth_mode == AuthMode.API_KEY
    extensions = list(agent.extensions or []) + list(platform_extensions or [])
    if caps["pushNotifications"]:
        extensions.append(delivery_extension(agent, origin, at_root=at_root))
    card: dict[str, Any] = {
        "name": agent.name,
        "description": agent.description,
        "version": agent.version,
        "supportedInterfaces": [
            {"url": base, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": base, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
            {"url": v03, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            {"url": v03, "protocolBinding": "HTTP+JSON", "protocolVersion": "0.3"},
        ],
        "capabilities": {**caps, **({"extensions": extensions} if extensions else {})},
        "defaultInputModes": agent.default_input_modes or ["text/plain"],
        "defaultOutputModes": agent.default_output_modes or ["text/plain"],
        "skills": _skills(agent),
        **security(agent),
    }
    if agent.provider_organization and agent.provider_url:
        card["provider"] = {"organization": agent.provider_organization, "url": agent.provider_url}
    if agent.documentation_url:
        card["documentationUrl"] = agent.documentation_url
    proto = json_format.ParseDict(card, a2a_pb2.AgentCard())
    return json_format.MessageToDict(proto)


def required_extensions(agent: Agent) -> set[str]:
    return {e["uri"] for e in agent.extensions or [] if e.get("required") and e.get("uri")}


def declared_extensions(agent: Agent) -> set[str]:
    return {e["uri"] for e in agent.extensions or [] if e.get("uri")}
