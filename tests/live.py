"""A live web process for interop tests: uvicorn serving the ASGI app on a free port.

Like the worker in tests.processes, it runs against the test database pytest-django created
and on the test broker, so a client talks to it over real HTTP (no test client, no in-process
ASGI). Use `start_web` / `LiveWeb.stop`, or the `live_web` context manager.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.processes import BIN, Proc, process_env

HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    """A port nothing listens on right now (the OS picks it; it may be taken again later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class LiveWeb:
    proc: Proc
    port: int

    @property
    def url(self) -> str:
        """The origin, without a trailing slash: `http://127.0.0.1:<port>`."""
        return f"http://{HOST}:{self.port}"

    def log(self) -> str:
        return self.proc.log()

    def stop(self, timeout: float = 15) -> None:
        self.proc.stop(timeout)


def _wait_healthy(web: LiveWeb, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if web.proc.popen.poll() is not None:
            raise RuntimeError(f"{web.proc.name} exited early:\n{web.log()[-3000:]}")
        try:
            response = httpx.get(f"{web.url}/healthz", timeout=2)
            if response.status_code == 200:
                return
            last_error = RuntimeError(f"/healthz answered {response.status_code}")
        except httpx.TransportError as exc:
            last_error = exc
        time.sleep(0.1)
    raise TimeoutError(
        f"{web.proc.name}: /healthz did not answer in {timeout}s ({last_error!r}):\n"
        f"{web.log()[-3000:]}"
    )


def start_web(
    log_dir: Path, name: str = "web", timeout: float = 30, attempts: int = 3, **env: str
) -> LiveWeb:
    """Start `uvicorn a2a_platform.asgi:application` on a free port; return once /healthz
    answers 200. Retried on another port when the chosen one was taken in between."""
    for attempt in range(1, attempts + 1):
        port = free_port()
        cmd = [
            str(BIN / "uvicorn"),
            "a2a_platform.asgi:application",
            "--host",
            HOST,
            "--port",
            str(port),
            "--lifespan",
            "on",
            "--no-access-log",
        ]
        proc_name = name if attempt == 1 else f"{name}-{attempt}"
        web = LiveWeb(Proc(proc_name, cmd, process_env(**env), log_dir), port)
        try:
            _wait_healthy(web, timeout)
            return web
        except RuntimeError:
            web.stop()
            if attempt == attempts or "address already in use" not in web.log().lower():
                raise
    raise AssertionError("unreachable")


# Beyond a web process's A2A_AGENT_CACHE_SECONDS: the card's own work (readiness, rendering).
AGENT_CACHE_SLACK_SECONDS = 5.0


def wait_serving(
    web: LiveWeb, url: str, ok: Callable[[httpx.Response], bool], timeout: float = 30
) -> httpx.Response:
    """Poll GET `url` on `web` until it answers 200 and `ok(response)`; return that answer."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            response = httpx.get(url, timeout=5)
            if response.status_code == 200 and ok(response):
                return response
            last = (response.status_code, response.text[:300])
        except httpx.TransportError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{web.proc.name}: {url} not as expected in {timeout}s: {last!r}")
        time.sleep(0.05)


def wait_serving_default(webs: Iterable[LiveWeb], name: str) -> None:
    """Poll each web process's root card until it is the agent called `name`.

    A web process caches the agent each tenant resolves to for A2A_AGENT_CACHE_SECONDS (per
    process; the same setting the children read): after the default agent changes (each test
    makes its own, and the last test's was flushed), the origin root may still answer for the
    previous one until its entry expires. Fails past that bound plus a small slack."""
    from django.conf import settings

    bound = settings.A2A_AGENT_CACHE_SECONDS + AGENT_CACHE_SLACK_SECONDS
    for web in webs:
        card = f"{web.url}/.well-known/agent-card.json"
        wait_serving(web, card, lambda r: r.json().get("name") == name, timeout=bound)


@contextmanager
def live_web(log_dir: Path, **kw) -> Iterator[LiveWeb]:
    web = start_web(log_dir, **kw)
    try:
        yield web
    finally:
        web.stop()
