"""In-process calls to the protocol ASGI app (the app itself, not Django's test client).

Live-server interop with the official SDK client lives in tests/interop/.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from a2a_platform.asgi import application
from tasks.event_hub import get_hub
from tests.readiness_helpers import mark_workers_live, readiness_reset


class Wire:
    """Synchronous helpers around an httpx client bound to the ASGI app."""

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.concurrently([(method, path, kw)])[0]

    def concurrently(self, requests: list[tuple[str, str, dict]]) -> list[httpx.Response]:
        """(method, path, httpx keyword arguments) each, made at once; answers in order."""

        async def go() -> list[httpx.Response]:
            # Each call runs in a fresh event loop: give it the event hub a web process has
            # (started in the lifespan under uvicorn), and close it afterwards.
            hub = get_hub()
            await hub.start()
            try:
                transport = httpx.ASGITransport(app=application)
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://testserver"
                ) as c:
                    return await asyncio.gather(
                        *(c.request(method, path, **kw) for method, path, kw in requests)
                    )
            finally:
                await hub.stop()

        return asyncio.run(go())

    def rpc(
        self,
        method: str,
        params: Any = None,
        *,
        path: str = "/",
        id_: Any = 1,
        headers: dict | None = None,
    ) -> dict:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            body["params"] = params
        resp = self.request("POST", path, json=body, headers=headers or {})
        return resp.json()


@pytest.fixture
def wire(transactional_db) -> Wire:
    mark_workers_live()
    yield Wire()
    readiness_reset()
