"""What the safety nets see as due: each config once, by its head (the oldest open delivery).

A config's backlog queued behind a head that waits for its retry is past its
`next_attempt_at` too; it must neither repeat the config nor push other configs' due heads
out of the sweeper's batch (the case of one receiver down with a long backlog).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone

from tests.webhook_checks import configure, open_task
from webhooks.delivery import heads
from webhooks.delivery.claim_record import delivery_claim_batch
from webhooks.models import Delivery
from webhooks.selectors import due_configs
from webhooks.services import endpoint_pause, endpoint_resume

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _loopback(settings):
    configure(settings)


def backlog(config, count: int, at) -> None:
    """`count` status deliveries queued behind the config's snapshot (written as the outbox
    writes them: the config is owed them)."""
    snapshot = Delivery.objects.get(config=config)
    for i in range(count):
        Delivery.objects.create(
            config=config,
            binding=snapshot.binding,
            task_id=config.task_id,
            seq=snapshot.seq + 1 + i,
            kind="status",
            body="{}",
            next_attempt_at=at,
        )
    heads.owe([config.pk], at)


def reschedule(config) -> None:
    """What a record does after moving a delivery's time: the config's head time follows."""
    with transaction.atomic():
        heads.refresh(heads.lock([config.pk]))


def test_due_configs_lists_each_config_once_by_its_due_head(scripted_agent):
    now = timezone.now()
    _, (waiting,) = open_task(scripted_agent, "x", {"url": "http://127.0.0.1:9/a"})
    _, (due,) = open_task(scripted_agent, "x", {"url": "http://127.0.0.1:9/b"})
    # `waiting`: its head retries in a minute; three deliveries wait behind it since long ago.
    Delivery.objects.filter(config=waiting).update(next_attempt_at=now + timedelta(minutes=1))
    backlog(waiting, 3, now - timedelta(minutes=10))
    reschedule(waiting)
    # `due`: its head is due (more recently than that backlog).
    Delivery.objects.filter(config=due).update(next_attempt_at=now - timedelta(seconds=1))
    reschedule(due)

    assert due_configs() == [due.pk]
    assert due_configs(limit=1) == [due.pk]

    # Once the head of `waiting` is due, it is listed once, longest-waiting first.
    Delivery.objects.filter(config=waiting, kind="snapshot").update(
        next_attempt_at=now - timedelta(minutes=20)
    )
    reschedule(waiting)
    assert due_configs() == [waiting.pk, due.pk]
    assert due_configs(limit=1) == [waiting.pk]


@pytest.mark.django_db(transaction=True)
def test_paused_endpoints_are_not_due_and_resuming_rings_for_one_pump(scripted_agent, settings):
    jobs = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)  # where the app publishes
    # Every ring publishes a job now (no bell to share), so the jobs count the rings.
    settings.CELERY_BROKER_URL = "filesystem://"
    _, (first,) = open_task(scripted_agent, "x", {"url": "http://127.0.0.1:9/a"})
    _, (second,) = open_task(scripted_agent, "x", {"url": "http://127.0.0.1:9/b"})
    backlog(first, 4, timezone.now())
    endpoint = first.bindings.get().endpoint
    assert second.bindings.get().endpoint == endpoint  # one origin
    endpoint_pause(endpoint_pk=endpoint.pk, actor="ops")
    assert delivery_claim_batch(limit=10).claims == ()  # paused: the claim parks both configs
    assert due_configs() == []  # nothing for the sweeper to ring for a pump for
    assert [d.attempts for d in Delivery.objects.filter(config__in=[first, second])] == [0] * 6

    before = jobs.llen("webhooks")
    endpoint_resume(endpoint_pk=endpoint.pk, actor="ops")
    assert jobs.llen("webhooks") - before == 1  # one ring, not one per config or delivery
    assert sorted(due_configs()) == sorted([first.pk, second.pk])


def test_the_sweeper_repairs_a_config_owing_deliveries_without_a_head_time(scripted_agent):
    _, (config,) = open_task(scripted_agent, "x", {"url": "http://127.0.0.1:9/a"})
    long_ago = timezone.now() - timedelta(minutes=5)
    Delivery.objects.filter(config=config).update(created_at=long_ago, next_attempt_at=long_ago)
    config.__class__.objects.filter(pk=config.pk).update(head_due_at=None)  # a bug elsewhere
    assert due_configs() == []

    assert heads.repair() == 1
    assert due_configs() == [config.pk]
    assert heads.repair() == 0
