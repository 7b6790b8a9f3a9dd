"""The official a2a-sdk's own server, as a baseline for bench/sdk_compare.py (never a test).

The SDK's `DefaultRequestHandler` over its `InMemoryTaskStore` (or, with `--store sqlite`,
its `DatabaseTaskStore` on a SQLite file), serving the HTTP+JSON and JSON-RPC routes and the
agent card, with a trivial agent that does what the platform's echo executor does:
SUBMITTED → WORKING → one artifact echoing the text → COMPLETED.

    .venv/bin/python bench/sdk_server.py --port 9000 [--store memory|sqlite]

Prints `completed <n>` on SIGUSR1 (tasks its agent has finished), so the bench can count
completions without reading the store.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part
from hosted_agents import start_task  # bench/ is this script's directory: on sys.path
from starlette.applications import Starlette

COMPLETED = 0


class EchoExecutor(AgentExecutor):
    """SUBMITTED → WORKING → artifact (the text, echoed) → COMPLETED, in-process."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        global COMPLETED
        updater = await start_task(context, event_queue)
        await updater.add_artifact([Part(text=context.get_user_input())], name="echo")
        await updater.complete()
        COMPLETED += 1

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


ECHO_SKILL = AgentSkill(id="echo", name="echo", description="echoes", tags=["echo"])


def card(
    base: str,
    *,
    name: str = "SDK echo",
    description: str = "The official SDK's server with an echo agent (bench baseline)",
    skill: AgentSkill = ECHO_SKILL,
) -> AgentCard:
    """The card of a server at `base`: both bindings (HTTP+JSON at the root, JSON-RPC at
    /rpc), streaming, text in and out, one skill (bench/hosted_bench.py's SDK servers too)."""
    return AgentCard(
        name=name,
        description=description,
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=base, protocol_binding="HTTP+JSON", protocol_version="1.0"),
            AgentInterface(url=f"{base}/rpc", protocol_binding="JSONRPC", protocol_version="1.0"),
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[skill],
    )


def store(kind: str, path: str):
    if kind == "memory":
        return InMemoryTaskStore()
    from a2a.server.tasks import DatabaseTaskStore
    from sqlalchemy.ext.asyncio import create_async_engine

    return DatabaseTaskStore(create_async_engine(f"sqlite+aiosqlite:///{path}"))


def app(agent_card: AgentCard, executor: AgentExecutor, task_store) -> Starlette:
    """`DefaultRequestHandler` for `executor` over `task_store`: the card, the JSON-RPC route
    (/rpc) and the HTTP+JSON routes (bench/hosted_bench.py's SDK servers too)."""
    handler = DefaultRequestHandler(
        agent_executor=executor, task_store=task_store, agent_card=agent_card
    )
    routes = [
        *create_agent_card_routes(agent_card),
        *create_jsonrpc_routes(handler, rpc_url="/rpc"),
        *create_rest_routes(handler),
    ]
    return Starlette(routes=routes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    parser.add_argument("--sqlite-path", default="/tmp/a2a-sdk-bench.sqlite3")
    args = parser.parse_args()
    base = f"http://127.0.0.1:{args.port}"

    def report(*_: object) -> None:
        print(f"completed {COMPLETED}", flush=True)

    config = uvicorn.Config(
        app(card(base), EchoExecutor(), store(args.store, args.sqlite_path)),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, report)
        await server.serve()

    asyncio.run(serve())
    sys.exit(0)


if __name__ == "__main__":
    main()
