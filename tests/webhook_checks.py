"""Shared by the webhook delivery e2e and fault tests: a real worker with short delivery
timings, tasks opened with push configs, and what a receiver process got — verified the way a
client verifies it (`webhooks.receiver.WebhookVerifier`) and compared with the outbox.

What "delivered" means here, for one config:
- every record verifies (Standard Webhooks v1a signature against the agent's JWKS; the Bearer
  JWT and the notification token when the config has them), with the headers we promise;
- the config's deliveries are its snapshot and then every status/artifact event of the task
  after it, each DELIVERED, and each was received with its delivery's event id as
  `webhook-id` and its exact body;
- duplicates only with the same `webhook-id` (and then the same body and seq);
- per-config order: the receiver saw the deliveries in order; a delivery is (re)sent only
  until the receiver accepted it, and the next one only after that.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterable
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from django_celery_beat.models import PeriodicTask

from agents.signing import jwks
from tasks import services
from tasks.models import Task, TaskEvent
from tasks.states import TERMINAL_STATES
from tests.factories import user_message
from tests.processes import wait_until
from tests.webhook_receiver import ReceiverProcess, Record
from webhooks.job_names import SWEEP_DELIVERIES_JOB
from webhooks.models import Delivery, DeliveryAttempt, DeliveryState, PushConfig
from webhooks.receiver import VerifiedDelivery, WebhookVerifier
from webhooks.services import push_config_create

ALLOWED = "127.0.0.0/8"
TIMEOUT_SECONDS = 2
# The worker's delivery settings (env); tests override single ones.
WORKER_ENV = {
    "A2A_WEBHOOK_ALLOWED_NETWORKS": ALLOWED,
    "A2A_WEBHOOK_RETRY_SCHEDULE": "1,1,1,2,2",
    "A2A_WEBHOOK_AUTH_RETRY_SCHEDULE": "1",
    "A2A_WEBHOOK_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS),
}


# A module whose real processes deliver to receivers on loopback: its data committed (the
# processes read it), slow, and this process allowed to register loopback webhooks.
LOOPBACK_DELIVERY_MARKS = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]


def configure(settings) -> None:
    """The test process's side (pytest-django `settings`): it registers the webhooks, so it
    must allow the loopback receivers too."""
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = [ALLOWED]
    settings.A2A_WEBHOOK_TIMEOUT_SECONDS = TIMEOUT_SECONDS


def start_worker(procs, name: str = "worker", **env: str):
    """A worker on all three queues with the I/O-concurrent pool the webhooks queue needs."""
    return procs.worker(name=name, pool="threads", concurrency=8, **{**WORKER_ENV, **env})


def start_beat(procs, **env: str):
    """Beat (a subprocess on the test database) firing both sweepers and the rebind monitor
    every second."""
    with override_settings(
        A2A_SWEEP_INTERVAL_SECONDS=1,
        A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS=1,
        A2A_REBIND_MONITOR_INTERVAL_SECONDS=1,
    ):
        call_command("sync_schedules", stdout=io.StringIO())
    sweep = PeriodicTask.objects.get(task=SWEEP_DELIVERIES_JOB)
    assert sweep.interval.every == 1
    return procs.beat(**env)


def open_task(agent, text: str, *configs: dict[str, Any]) -> tuple[Task, list[PushConfig]]:
    """A task and its push configs in one transaction (as SendMessage with an inline config
    does): the snapshot is the task as created, every later event is owed."""
    pushes: list[PushConfig] = []

    def register(result) -> None:  # SendMessage's inline config, inside the send's transaction
        pushes.extend(push_config_create(task=result.task, config=cfg).config for cfg in configs)

    task = services.task_send(
        agent=agent, owner="o", message=user_message(text), within=register
    ).task
    return task, pushes


def wait_terminal(task: Task, timeout: float = 30) -> Task:
    return wait_until(
        lambda: Task.objects.filter(pk=task.pk, state__in=TERMINAL_STATES).first(),
        timeout=timeout,
        message=f"task {task.pk} terminal",
    )


def deliveries(config: PushConfig) -> list[Delivery]:
    return list(Delivery.objects.filter(config=config).order_by("id"))


def settled(config: PushConfig, state: str = DeliveryState.DELIVERED) -> bool:
    """The config's task is terminal and every delivery it owes is in `state`."""
    if not Task.objects.filter(pk=config.task_id, state__in=TERMINAL_STATES).exists():
        return False
    rows = deliveries(config)
    return [d.seq for d in rows] == owed_seqs(config) and all(d.state == state for d in rows)


def wait_all(config: PushConfig, state: str = DeliveryState.DELIVERED, timeout: float = 30):
    """Wait until `settled(config, state)`."""
    return wait_until(
        lambda: settled(config, state), timeout=timeout, message=f"config {config.pk}: all {state}"
    )


def owed_seqs(config: PushConfig) -> list[int]:
    """What the config owes: its snapshot, then every status/artifact event after it."""
    snapshot = Delivery.objects.get(config=config, kind="snapshot")
    events = TaskEvent.objects.filter(
        task_id=config.task_id, kind__in=("status", "artifact"), seq__gt=snapshot.seq
    ).order_by("seq")
    return [snapshot.seq, *events.values_list("seq", flat=True)]


def accepted(record: Record, timeout: float = TIMEOUT_SECONDS) -> bool:
    """Did the receiver accept it (a 2xx the sender got, not one after it gave up)?"""
    status = int(record.answer.get("status") or 200)
    hang = float(record.answer.get("hang") or 0)
    return 200 <= status < 300 and hang < timeout


def verify(
    records: Iterable[Record],
    agent,
    *,
    url: str,
    token: str | None = None,
    bearer: bool = False,
    issuer: str | None = None,
    jwks_doc: dict | None = None,
) -> list[VerifiedDelivery]:
    """Verify every record as a client would; checks the promised headers too."""
    verifier = WebhookVerifier(jwks=jwks_doc or jwks(agent))
    out = []
    for record in records:
        assert record.method == "POST"
        assert record.header("content-type") == "application/a2a+json"
        assert record.header("x-a2a-binding-version")
        assert record.header("x-a2a-task-seq")
        if token is None:
            assert record.header("x-a2a-notification-token") is None
        if not bearer:
            assert record.header("authorization") is None
        verified = verifier.verify(
            record.headers,
            record.body,
            expected_audience=url if bearer else None,
            expected_token=token,
            expected_issuer=issuer,
        )
        if bearer:
            claims = verified.jwt_claims
            assert claims is not None, "a Bearer config without credentials gets our JWT"
            assert record.header("authorization").startswith("Bearer ")
            assert claims["aud"] == url
            assert claims["jti"] == record.webhook_id
            assert claims["seq"] == record.seq
            assert claims["bindingVersion"] == record.header("x-a2a-binding-version")
        assert verified.event_id == record.webhook_id
        assert verified.seq == record.seq
        assert verified.task_id == record.header("x-a2a-task-id")
        out.append(verified)
    return out


def assert_in_order(records: list[Record], event_ids: list[str], *, final=accepted) -> None:
    """Per-config order with retries: the records walk the event ids in order, a delivery is
    re-sent only while the receiver has not answered it finally, and the next starts only
    after the previous one's last try was final."""
    index = {eid: i for i, eid in enumerate(event_ids)}
    unknown = [r.webhook_id for r in records if r.webhook_id not in index]
    assert not unknown, f"webhook ids the config does not owe: {unknown}"
    walk = [index[r.webhook_id] for r in records]
    assert walk, "nothing received"
    assert walk[0] == 0, f"the first delivery received is #{walk[0]}"
    for before, after, previous in zip(walk, walk[1:], records, strict=False):
        assert after in (before, before + 1), f"out of order: #{before} then #{after}"
        if after == before + 1:
            assert final(previous), f"#{after} sent before #{before} was answered: {previous}"
    assert walk[-1] == len(event_ids) - 1, f"only {walk[-1] + 1} of {len(event_ids)} received"
    assert final(records[-1])


def assert_delivered(
    receiver: ReceiverProcess,
    config: PushConfig,
    agent,
    *,
    token: str | None = None,
    bearer: bool = False,
    exactly_once: bool = True,
    records: list[Record] | None = None,
    issuer: str | None = None,
    jwks_doc: dict | None = None,
) -> list[Record]:
    """Everything `config` owes reached `receiver`, verified, in order (module docstring).
    Returns the records of this config's deliveries."""
    rows = deliveries(config)
    assert [d.seq for d in rows] == owed_seqs(config)
    assert rows[0].kind == "snapshot"
    assert [d.state for d in rows] == [DeliveryState.DELIVERED] * len(rows)
    by_id = {str(d.event_id): d for d in rows}
    if records is None:
        records = [r for r in receiver.records() if r.webhook_id in by_id]
    verify(
        records,
        agent,
        url=receiver.url,
        token=token,
        bearer=bearer,
        issuer=issuer,
        jwks_doc=jwks_doc,
    )
    binding_version = f"{config.config_id}.v1"
    for record in records:
        delivery = by_id[record.webhook_id]
        assert record.body == delivery.body.encode(), "the body differs between tries"
        assert record.seq == delivery.seq
        assert record.header("x-a2a-event-kind") == delivery.kind
        assert record.header("x-a2a-binding-version") == binding_version
        assert record.path == receiver.path
    assert_in_order(records, list(by_id))
    if exactly_once:
        assert [r.webhook_id for r in records] == list(by_id), "each delivery exactly once"
    # Exactly one accepted answer per delivery: nothing re-sent after the receiver took it.
    accepted_ids = [r.webhook_id for r in records if accepted(r)]
    assert accepted_ids == list(by_id)

    # The bodies are the StreamResponses: the snapshot, then each event's payload.
    task = Task.objects.get(pk=config.task_id)
    events = {e.seq: e.payload for e in TaskEvent.objects.filter(task=task)}
    first = json.loads(rows[0].body)
    assert first["task"]["id"] == str(task.pk)
    for delivery in rows[1:]:
        assert json.loads(delivery.body) == events[delivery.seq]
    return records


def waits_its_schedule(delivery: Delivery, wait_seconds: float) -> bool:
    """A delivery's next try is a schedule's wait after its latest attempt, not at once: at
    least the wait's lower bound (80 %: webhooks/delivery/retry_policy.py's jitter), whenever the
    test reads it."""
    latest = DeliveryAttempt.objects.filter(delivery=delivery).latest("started_at")
    return delivery.next_attempt_at >= latest.started_at + dt.timedelta(seconds=wait_seconds * 0.8)
