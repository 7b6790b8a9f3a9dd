"""In-process calls to the protocol ASGI app (the app itself, not Django's test client).

Live-server interop with the official SDK client lives in tests/interop/.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from a2a_platform.asgi import application


class Wire:
    """Synchronous helpers around an httpx client bound to the ASGI app."""

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=application)
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
                return await c.request(method, path, **kw)

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
    return Wire()
