"""The worker services the heartbeat job and the worker-ready signal call
(webhooks.services.worker_register / worker_heartbeat), without a worker process."""

from __future__ import annotations

import pytest

from agents.models import WorkerHeartbeat
from tests.factories import AgentFactory
from webhooks.services import worker_heartbeat, worker_register

pytestmark = pytest.mark.django_db


def test_worker_heartbeat_registers_a_worker_without_a_row_then_only_beats():
    assert worker_heartbeat(hostname="w1", queues=["webhooks"]) is True
    row = WorkerHeartbeat.objects.get(hostname="w1")
    assert row.queues == ["webhooks"]
    assert row.backlog_reenqueued_at is not None  # nothing was due: the re-enqueue is done
    assert worker_heartbeat(hostname="w1", queues=["webhooks"]) is False


def test_worker_heartbeat_registers_again_when_the_backlog_re_enqueue_failed():
    worker_register(hostname="w2", queues=["webhooks"])
    WorkerHeartbeat.objects.filter(hostname="w2").update(backlog_reenqueued_at=None)
    assert worker_heartbeat(hostname="w2", queues=["webhooks"]) is True
    assert WorkerHeartbeat.objects.get(hostname="w2").backlog_reenqueued_at is not None


def test_a_worker_on_agents_reports_its_hosted_executors_at_start_and_with_each_beat():
    AgentFactory(slug="quiet", executor="python:tests.hosted_agents:QuietExecutor")
    AgentFactory(slug="off", executor="python:no_such_module:Off", enabled=False)
    worker_register(hostname="w3", queues=["agents", "heartbeat"])
    row = WorkerHeartbeat.objects.get(hostname="w3")
    assert row.hosted == {"python:tests.hosted_agents:QuietExecutor": None}  # enabled only

    AgentFactory(slug="broken", executor="python:no_such_module:X")
    assert worker_heartbeat(hostname="w3", queues=["agents", "heartbeat"]) is False
    row.refresh_from_db()
    assert row.hosted["python:tests.hosted_agents:QuietExecutor"] is None
    assert row.hosted["python:no_such_module:X"].startswith("ModuleNotFoundError: ")


def test_a_worker_not_on_agents_reports_no_hosted_executor():
    AgentFactory(slug="quiet", executor="python:tests.hosted_agents:QuietExecutor")
    assert worker_heartbeat(hostname="w4", queues=["webhooks"]) is True
    assert WorkerHeartbeat.objects.get(hostname="w4").hosted == {}
