"""a2a-sdk's own server hosting one AgentExecutor: the reference the interop tests hold the
platform to (tests/interop/test_hosted_vs_sdk.py).

The SDK's `DefaultRequestHandler` over its `InMemoryTaskStore`, serving the agent card and the
JSON-RPC and HTTP+JSON routes at protocol 1.0, as an agent's author would run it before moving
it to the platform. The executor is named as the platform names it,
`python:<module>:<attribute>`, and built the same way (a class or a zero-argument factory);
the module is imported from this process's PYTHONPATH. No Django: a peer we did not write.

    .venv/bin/python -m tests.sdk_server --port 9000 \
        --executor python:examples.currency_agent.agent:CurrencyAgentExecutor
"""

from __future__ import annotations

import argparse
import importlib

import uvicorn
from a2a.server.agent_execution import AgentExecutor
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from starlette.applications import Starlette

HOSTED_PREFIX = "python:"
JSONRPC_PATH = "/rpc"


def load_executor(spec: str) -> AgentExecutor:
    """The executor `python:<module>:<attribute>` names: the attribute called with no
    arguments (a class or a factory)."""
    if not spec.startswith(HOSTED_PREFIX):
        raise ValueError(f"not a hosted executor: {spec!r}")
    module_name, _, attribute = spec.removeprefix(HOSTED_PREFIX).partition(":")
    executor = getattr(importlib.import_module(module_name), attribute)()
    if not isinstance(executor, AgentExecutor):
        raise TypeError(f"{spec} built a {type(executor).__name__}, not an AgentExecutor")
    return executor


def agent_card(base: str, spec: str) -> AgentCard:
    """A card with the two HTTP bindings at 1.0 and streaming, as the platform advertises."""
    return AgentCard(
        name="SDK-hosted agent",
        description=f"a2a-sdk's own server hosting {spec}",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=base, protocol_binding="HTTP+JSON", protocol_version="1.0"),
            AgentInterface(
                url=f"{base}{JSONRPC_PATH}", protocol_binding="JSONRPC", protocol_version="1.0"
            ),
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="agent", name="agent", description=spec, tags=["interop"])],
    )


def build_app(spec: str, base: str) -> Starlette:
    card = agent_card(base, spec)
    handler = DefaultRequestHandler(
        agent_executor=load_executor(spec), task_store=InMemoryTaskStore(), agent_card=card
    )
    return Starlette(
        routes=[
            *create_agent_card_routes(card),
            *create_jsonrpc_routes(handler, rpc_url=JSONRPC_PATH),
            *create_rest_routes(handler),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executor", required=True, help="python:<module>:<attribute>")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"
    uvicorn.run(
        build_app(args.executor, base),
        host="127.0.0.1",
        port=args.port,
        log_level="info",
        access_log=False,
    )


if __name__ == "__main__":
    main()
