"""A2A_LOG_FORMAT=json from real processes: a uvicorn web process, a Celery worker and Celery
beat, on the test database and broker, write nothing but JSON objects, one a line, from their
start to their stop (docs/observability.md, "Logs")."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command
from django.test import override_settings

from tests import live
from tests.factories import AgentFactory, user_message
from tests.processes import Proc, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JSON = {
    "A2A_LOG_FORMAT": "json",
    # Every step of a task, every job received and run, every job beat sends: the lines whose
    # fields this test reads.
    "A2A_TASK_LOG_LEVEL": "INFO",
    "A2A_JOB_LOG_LEVEL": "INFO",
}
FIELDS = {"time", "level", "logger", "message", "role", "pid"}


def json_lines(proc: Proc) -> list[dict]:
    """Every line `proc` wrote, each parsed as JSON (a line that is not fails the test)."""
    out = []
    for n, line in enumerate(Path(proc.log_path).read_text().splitlines(), start=1):
        try:
            parsed = json.loads(line)
        except ValueError:
            pytest.fail(f"{proc.name} line {n} is not JSON: {line!r}\n{proc.log()[-3000:]}")
        assert isinstance(parsed, dict), line
        assert set(parsed) >= FIELDS, line
        out.append(parsed)
    return out


def lines_of(proc: Proc, **fields) -> list[dict]:
    """`proc`'s lines so far that parse and hold `fields` (for waiting on a line)."""
    found = []
    for line in Path(proc.log_path).read_text().splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if all(parsed.get(k) == v for k, v in fields.items()):
            found.append(parsed)
    return found


def test_json_logs_parse_line_by_line_from_web_worker_and_beat(procs, tmp_path):
    agent = AgentFactory(executor="echo")
    # Beat's schedules (the heartbeat every second), as `make run` writes them.
    with override_settings(A2A_HEARTBEAT_INTERVAL_SECONDS=1):
        call_command("sync_schedules", stdout=io.StringIO())
    worker = procs.worker(**JSON)
    beat = procs.beat(**JSON)
    # No readiness drain on SIGTERM: it stops at once.
    live_web = live.start_web(tmp_path, A2A_SHUTDOWN_GRACE_SECONDS="0", **JSON)
    web = procs.adopt(live_web.proc)
    base = live_web.url

    envelope = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": user_message("hello")},
    }
    response = httpx.post(
        f"{base}/{agent.slug}/", json=envelope, headers={"A2A-Version": "1.0"}, timeout=30
    )
    assert response.status_code == 200, response.text
    task = response.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    task_id = task["id"]
    # Django's own request logging too: a 503 here is logged with the request object as an
    # extra, which JSON cannot carry as it is.
    assert httpx.get(f"{base}/readyz", timeout=10).status_code in (200, 503)

    # The worker ran the task's executor job; beat sent at least one periodic job.
    wait_until(lambda: lines_of(worker, task_id=task_id), message="the worker's task line")
    wait_until(
        lambda: [x for x in lines_of(beat, role="beat") if "Sending due task" in x["message"]],
        message="beat's line for a job sent",
    )
    for proc in (web, worker, beat):
        proc.stop()  # their shutdown lines too

    web_lines, worker_lines, beat_lines = (json_lines(p) for p in (web, worker, beat))
    for role, lines in (("web", web_lines), ("worker", worker_lines), ("beat", beat_lines)):
        assert lines, role
        assert {line["role"] for line in lines} == {role}

    # The web: uvicorn's own lines and the platform's, the task's with its id.
    web_loggers = {line["logger"] for line in web_lines}
    assert "uvicorn.error" in web_loggers
    assert any(
        line["message"] == "task created" and line["agent"] == agent.slug
        for line in web_lines
        if line.get("task_id") == task_id
    )

    # The worker: its task lines carry the task's id; Celery's own lines (job received, job
    # succeeded, ready, shutdown) are JSON too.
    task_lines = [line for line in worker_lines if line["logger"].startswith("tasks.")]
    assert task_lines
    assert any(line.get("task_id") == task_id for line in task_lines)
    assert all("task_id" in line for line in task_lines if line["logger"] == "tasks.lifecycle")
    worker_messages = [line["message"] for line in worker_lines]
    assert any(m.endswith(" ready.") for m in worker_messages)
    assert any(" received" in m for m in worker_messages if "Task " in m)
    assert any(" succeeded in " in m for m in worker_messages)
    assert any("Warm shutdown" in m for m in worker_messages)

    # Beat: starting, and the jobs it sent.
    beat_messages = [line["message"] for line in beat_lines]
    assert any(m.startswith("beat: Starting") for m in beat_messages)
    assert any("Sending due task" in m for m in beat_messages)
