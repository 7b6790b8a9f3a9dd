"""Exactly what `make run` starts, end to end: the embedded defaults (SQLite under a var
directory of its own, kombu's file-system broker), `manage.py migrate`, `seed_demo`,
`sync_schedules`, then `run_platform` supervising web, worker and beat.

A client streams a task over JSON-RPC (SendStreamingMessage, with an inline push config): the
scripted executor runs on the worker, the SSE stream sees its events as they happen (the SQLite
event hub polls), and a webhook receiver process gets every event, verified against the JWKS
the server publishes. Ctrl-C (SIGINT) stops all three processes. Nothing here touches the
test database: the platform under test has its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.live import free_port
from tests.sse import http_events
from tests.webhook_receiver import ReceiverProcess
from webhooks.receiver import WebhookVerifier

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The test run's servers are not the platform's here: it uses its embedded defaults.
NOT_INHERITED = {"DATABASE_URL", "CELERY_BROKER_URL", "A2A_PROFILE", "A2A_TEST_DATABASE_URL"}


def embedded_env(var_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update(
        {
            "A2A_VAR_DIR": str(var_dir),
            "PORT": str(port),
            # The receiver is on loopback, as a developer's would be (the Makefile's default).
            "A2A_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
            "A2A_ADMIN_PASSWORD": "embedded-test",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def wait_ready(base: str, platform: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    """Until /readyz says ready (a worker beat-proven live: the card is served only then)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        assert platform.poll() is None, f"run_platform exited early:\n{log.read_text()[-4000:]}"
        try:
            last = httpx.get(f"{base}/readyz", timeout=5)
            if last.status_code == 200:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise TimeoutError(f"not ready in {timeout}s: {last}\n{log.read_text()[-4000:]}")


def rpc(method: str, params: dict, id_: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


async def stream_task(base: str, hook_url: str) -> list[dict]:
    """SendStreamingMessage over JSON-RPC until the task is final: each event's result."""
    params = {
        "message": {
            "role": "ROLE_USER",
            "messageId": "embedded-1",
            "parts": [{"text": "work 1; chunks 2"}],
        },
        "configuration": {"taskPushNotificationConfig": {"id": "hook", "url": hook_url}},
    }
    results = []
    async with httpx.AsyncClient(timeout=30) as client:
        async for response, event in http_events(
            client,
            "POST",
            f"{base}/",
            json=rpc("SendStreamingMessage", params),
            headers={"A2A-Version": "1.0"},
        ):
            assert response.status_code == 200, event
            if event.is_comment:
                continue
            assert "result" in event.data, event.data
            results.append(event.data["result"])
            update = event.data["result"].get("statusUpdate")
            if update and update["status"]["state"] == "TASK_STATE_COMPLETED":
                break
    return results


def test_make_run_serves_streams_executes_and_delivers_on_the_embedded_defaults(tmp_path):
    var_dir, port = tmp_path / "var", free_port()
    env = embedded_env(var_dir, port)
    base = f"http://127.0.0.1:{port}"
    manage(env, "migrate", "--noinput")
    assert "created the demo agent" in manage(env, "seed_demo")
    manage(env, "sync_schedules")
    log = tmp_path / "run_platform.log"
    with open(log, "wb") as out:
        platform = subprocess.Popen(
            [sys.executable, "manage.py", "run_platform"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    receiver = ReceiverProcess(tmp_path, name="embedded-receiver").start()
    try:
        wait_ready(base, platform, log)
        assert (var_dir / "a2a.sqlite3").exists()  # the embedded database, not the test one
        assert (var_dir / "broker").is_dir()  # the file-system broker

        results = asyncio.run(stream_task(base, receiver.url))

        # The stream: the task as opened, then the executor's events as they happened.
        task_id = results[0]["task"]["id"]
        kinds = [next(iter(r)) for r in results]
        assert kinds[0] == "task"
        states = [r["statusUpdate"]["status"]["state"] for r in results if "statusUpdate" in r]
        assert states[0] == "TASK_STATE_WORKING"
        assert states[-1] == "TASK_STATE_COMPLETED"
        chunks = [
            r["artifactUpdate"]["artifact"]["parts"][0]["text"]
            for r in results
            if "artifactUpdate" in r
        ]
        assert chunks[:2] == ["chunk 1 of 2", "chunk 2 of 2"]

        # The webhook: the snapshot and every event after it, in order, verified as a client
        # verifies it (the JWKS the platform publishes for the demo agent).
        jwks = httpx.get(f"{base}/demo/.well-known/jwks.json", timeout=10).json()
        records = receiver.wait_for(
            lambda rs: any(
                '"TASK_STATE_COMPLETED"' in r.body.decode() and "statusUpdate" in r.payload
                for r in rs
            ),
            timeout=60,
            message="the completed status delivered",
        )
        verifier = WebhookVerifier(jwks=jwks)
        verified = [verifier.verify(r.headers, r.body) for r in records]
        assert {v.task_id for v in verified} == {task_id}
        seqs = [v.seq for v in verified]
        assert seqs == sorted(set(seqs)), f"out of order or repeated: {seqs}"
        assert records[0].payload["task"]["id"] == task_id  # the snapshot first
        delivered_kinds = [r.header("x-a2a-event-kind") for r in records]
        # The two chunks, then the echo artifact the script completes with.
        assert delivered_kinds.count("artifact") == 3
        assert delivered_kinds[-1] == "status"

        # The operators' reads on SQLite too: the management API's task list (with its
        # orphaned filter) and the admin's task list filtered the same way.
        token = manage(env, "create_api_token", "admin", "--name", "embedded", "--scope", "read")
        auth = {"Authorization": f"Bearer {token.strip().splitlines()[-1]}"}
        listed = httpx.get(f"{base}/api/v1/tasks/", headers=auth, timeout=10)
        assert listed.status_code == 200, listed.text
        assert [t["id"] for t in listed.json()["results"]] == [task_id]
        assert listed.json()["results"][0]["orphaned"] is False  # a boolean, as documented
        orphaned = httpx.get(f"{base}/api/v1/tasks/?orphaned=true", headers=auth, timeout=10)
        assert orphaned.status_code == 200, orphaned.text
        assert orphaned.json()["results"] == []
        kept = httpx.get(f"{base}/api/v1/tasks/?orphaned=false", headers=auth, timeout=10)
        assert [t["id"] for t in kept.json()["results"]] == [task_id]
        with httpx.Client(base_url=base, timeout=10) as admin:
            admin.get("/admin/login/")
            login = admin.post(
                "/admin/login/?next=/admin/",
                data={
                    "username": "admin",
                    "password": "embedded-test",
                    "csrfmiddlewaretoken": admin.cookies["csrftoken"],
                },
                headers={"Referer": f"{base}/admin/login/"},
            )
            assert login.status_code == 302, login.text  # to `next`: logged in
            assert "sessionid" in admin.cookies, login.text
            page = admin.get("/admin/tasks/task/?push_channel=orphaned")
            assert page.status_code == 200, page.text[-2000:]
            assert "0 tasks" in page.text or "0 results" in page.text, page.text[-2000:]
    finally:
        receiver.stop()
        if platform.poll() is None:
            platform.send_signal(signal.SIGINT)  # what Ctrl-C in `make run` sends
        try:
            code = platform.wait(timeout=30)
        except subprocess.TimeoutExpired:
            platform.kill()
            raise
    output = log.read_text()
    assert code == 0, output[-4000:]
    assert "all stopped" in output
