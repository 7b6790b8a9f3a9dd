"""A live web process for interop tests: uvicorn serving the ASGI app on a free port.

Like the worker in tests.processes, it runs against the test database pytest-django created
and on the test broker, so a client talks to it over real HTTP (no test client, no in-process
ASGI). Use `start_web` / `LiveWeb.stop`, or the `live_web` context manager.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
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


@contextmanager
def live_web(log_dir: Path, **kw) -> Iterator[LiveWeb]:
    web = start_web(log_dir, **kw)
    try:
        yield web
    finally:
        web.stop()
