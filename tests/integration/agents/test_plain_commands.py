"""The conventional commands, as Celery's docs and deployment templates run them (issue 18):
`celery -A a2a_platform worker` with no `-Q`, and `celery -A a2a_platform beat` on a fresh
database where nobody ran `manage.py sync_schedules`. Together they make the instance ready:
the worker consumes the platform's three queues, beat writes the platform's missing schedules
itself (a2a_platform/beat.py: the rows sync_schedules writes, by name, so running it
afterwards duplicates nothing, and a row that exists is left as it is)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from agents import readiness
from agents.models import WorkerHeartbeat
from tests import processes
from tests.processes import Proc, wait_until
from webhooks.schedules import SCHEDULES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ENV = {"A2A_HEARTBEAT_INTERVAL_SECONDS": "1", "A2A_HEARTBEAT_FRESH_SECONDS": "5"}


def celery(tmp_path, name: str, *args: str) -> Proc:
    return Proc(
        name,
        [str(processes.BIN / "celery"), "-A", "a2a_platform", *args, "--loglevel", "INFO"],
        processes.process_env(**ENV),
        tmp_path,
    )


def platform_schedules() -> list[tuple[str, str, str | None, int]]:
    rows = PeriodicTask.objects.filter(name__in=SCHEDULES).select_related("interval")
    return sorted((p.name, p.task, p.queue, p.interval.every) for p in rows)


def test_plain_worker_and_beat_on_a_fresh_database_make_the_instance_ready(tmp_path, settings):
    assert not PeriodicTask.objects.exists()  # nobody ran sync_schedules
    started = []
    try:
        worker = celery(tmp_path, "worker", "worker", "-P", "threads", "-c", "4", "-n", "plain@%h")
        started.append(worker)
        worker.wait_for_log("ready.")
        beat = celery(tmp_path, "beat", "beat", "--schedule", str(tmp_path / "beat-schedule"))
        started.append(beat)
        beat.wait_for_log("beat: Starting")

        row = wait_until(
            lambda: (
                WorkerHeartbeat.objects.filter(
                    hostname__startswith="plain@",
                    beat_at__gte=readiness.timezone.now() - readiness.timedelta(seconds=5),
                )
                .exclude(backlog_reenqueued_at=None)
                .first()
            ),
            timeout=60,
            message="a heartbeat from the plain worker",
        )
        assert sorted(row.queues) == ["agents", "heartbeat", "webhooks"]
        settings.A2A_HEARTBEAT_FRESH_SECONDS = 5
        state = readiness.compute(include_hub=False)
        assert state.ready, state.failing()

        written_by_beat = platform_schedules()
        assert [name for name, *_ in written_by_beat] == sorted(SCHEDULES)
        assert ("worker heartbeat", "heartbeat.beat", "heartbeat", 1) in written_by_beat
    finally:
        for proc in reversed(started):
            proc.stop()

    # The operator's command afterwards: the same rows, none added.
    total = PeriodicTask.objects.count()
    settings.A2A_HEARTBEAT_INTERVAL_SECONDS = 1
    call_command("sync_schedules", stdout=io.StringIO())
    call_command("sync_schedules", stdout=io.StringIO())
    assert PeriodicTask.objects.count() == total
    assert [name for name, *_ in platform_schedules()] == sorted(SCHEDULES)


def test_beat_leaves_an_existing_schedule_as_it_is(tmp_path):
    """A row an operator (or sync_schedules under other settings) wrote keeps its interval and
    its enabled flag; only the missing ones are written."""
    every_7, _ = IntervalSchedule.objects.get_or_create(every=7, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(
        name="purge old rows", task="webhooks.purge_old_rows", interval=every_7, enabled=False
    )
    beat = celery(tmp_path, "beat", "beat", "--schedule", str(tmp_path / "beat-schedule"))
    try:
        beat.wait_for_log("beat: Starting")
        wait_until(
            lambda: PeriodicTask.objects.filter(name__in=SCHEDULES).count() == len(SCHEDULES),
            timeout=30,
            message="beat's schedules",
        )
    finally:
        beat.stop()
    purge = PeriodicTask.objects.get(name="purge old rows")
    assert (purge.interval.every, purge.enabled) == (7, False)
    assert [name for name, *_ in platform_schedules()] == sorted(SCHEDULES)
