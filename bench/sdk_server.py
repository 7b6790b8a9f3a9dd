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
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette

COMPLETED = 0


class EchoExecutor(AgentExecutor):
    """SUBMITTED → WORKING → artifact (the text, echoed) → COMPLETED, in-process."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        global COMPLETED
        if context.current_task is None:
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context.context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message] if context.message else [],
                )
            )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        await updater.add_artifact([Part(text=context.get_user_input())], name="echo")
        await updater.complete()
        COMPLETED += 1

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


def card(base: str) -> AgentCard:
    return AgentCard(
        name="SDK echo",
        description="The official SDK's server with an echo agent (bench baseline)",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=base, protocol_binding="HTTP+JSON", protocol_version="1.0"),
            AgentInterface(url=f"{base}/rpc", protocol_binding="JSONRPC", protocol_version="1.0"),
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["echo"])],
    )


def store(kind: str, path: str):
    if kind == "memory":
        return InMemoryTaskStore()
    from a2a.server.tasks import DatabaseTaskStore
    from sqlalchemy.ext.asyncio import create_async_engine

    return DatabaseTaskStore(create_async_engine(f"sqlite+aiosqlite:///{path}"))


def app(base: str, kind: str, path: str) -> Starlette:
    agent_card = card(base)
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=store(kind, path), agent_card=agent_card
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
        app(base, args.store, args.sqlite_path),
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
