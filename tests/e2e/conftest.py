"""Browser tests' shared fixtures: the ASGI server the browser talks to, and where their
screenshots go."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.sse import streams_reset

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts" / "e2e"


@pytest.fixture
def artifacts(request) -> Path:
    """A directory for this test's full-page screenshots, under var/ (git-ignored), kept
    after the run; its path is printed in the terminal summary."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    path = ARTIFACTS / name
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.png"):
        old.unlink()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    yield path
    if reporter is not None:
        shots = sorted(p.name for p in path.glob("*.png"))
        reporter.write_line(f"\n{request.node.name}: screenshots in {path}: {', '.join(shots)}")


@pytest.fixture
def asgi_server(transactional_db) -> Iterator[SimpleNamespace]:
    """`a2a_platform.asgi.application` under uvicorn, as `make run` and production serve it
    (not Django's WSGI live server), on a thread of this process so that the test's settings
    and monkeypatches apply to it. Stopped before the test database is flushed."""
    import threading

    import uvicorn

    from a2a_platform.asgi import application
    from tests.live import HOST, free_port

    port = free_port()
    config = uvicorn.Config(
        application, host=HOST, port=port, lifespan="on", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="asgi-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("the ASGI server did not start", pytrace=False)
        time.sleep(0.05)
    try:
        yield SimpleNamespace(url=f"http://{HOST}:{port}")
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        # Its lifespan's shutdown marked this process's stream registry as shutting down (as
        # a real server's last act): the in-process protocol tests that follow start anew.
        streams_reset()
