"""/metrics across real processes: two uvicorn web processes and two Celery workers on the
test PostgreSQL and Redis deliver to a real receiver; either web process's scrape, parsed
with prometheus_client's own parser, gives the same platform-wide counters, which match what
the receiver got, and no counter goes down when a worker restarts or retention purges the
rows the counters count (the purge job sent to a worker, as beat sends it)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tasks.models import Task, TaskEvent
from tests import live
from tests.factories import AgentFactory, user_message
from tests.processes import wait_until
from tests.readiness_helpers import mark_workers_live
from tests.webhook_checks import ALLOWED, accepted, start_worker, wait_all
from webhooks.jobs import purge_old_rows_job
from webhooks.models import Delivery, DeliveryState, PushConfig

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]

Samples = dict[tuple[str, frozenset], float]
SEND_ROUTE = "/{tenant}/message:send"


def scrape(web: live.LiveWeb) -> Samples:
    response = httpx.get(f"{web.url}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def counters(samples: Samples) -> Samples:
    """The samples that only ever grow: counters and histograms (buckets, count, sum)."""
    return {
        key: value
        for key, value in samples.items()
        if key[0].endswith(("_total", "_bucket", "_count", "_sum"))
    }


def platform_counters(samples: Samples) -> Samples:
    return {k: v for k, v in counters(samples).items() if k[0].startswith("a2a_")}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def assert_never_lower(before: Samples, after: Samples) -> None:
    lower = {k: (v, after.get(k)) for k, v in counters(before).items() if after.get(k, 0) < v}
    assert not lower, f"counters went down: {lower}"


def send(web: live.LiveWeb, agent, receiver_url: str, n: int) -> PushConfig:
    """SendMessage over HTTP+JSON with an inline push config, as a client registers one."""
    sent = httpx.post(
        f"{web.url}/{agent.slug}/message:send",
        headers={"A2A-Version": "1.0"},
        json={
            "message": user_message("chunks 2"),
            "configuration": {
                "returnImmediately": True,
                "taskPushNotificationConfig": {"id": f"cfg-{n}", "url": receiver_url},
            },
        },
        timeout=10,
    )
    assert sent.status_code == 200, sent.text
    return PushConfig.objects.get(task_id=sent.json()["task"]["id"])


def received(receiver) -> tuple[int, int]:
    """(requests the receiver got, distinct deliveries it accepted)."""
    records = receiver.records()
    return len(records), len({r.webhook_id for r in records if accepted(r)})


def test_two_webs_two_workers_count_what_the_receiver_got_through_restart_and_purge(
    tmp_path, procs, receivers
):
    agent = AgentFactory(executor="scripted")
    receiver = receivers.start()
    env = {
        "A2A_WEBHOOK_ALLOWED_NETWORKS": ALLOWED,
        "A2A_SHUTDOWN_GRACE_SECONDS": "0",
        "A2A_METRICS_FLUSH_SECONDS": "0.2",
    }
    webs = [live.start_web(tmp_path, name=f"web-{i}", **env) for i in range(2)]
    try:
        # Every delivered delivery is older than the cutoff when the purge runs.
        workers = [start_worker(procs, name=f"w{i}", A2A_RETENTION_DAYS="0") for i in range(2)]
        for web in webs:
            mark_workers_live(web_url=web.url)
        configs = [send(webs[i % 2], agent, receiver.url, i) for i in range(4)]
        for config in configs:
            wait_all(config, timeout=30)

        first = scrape(webs[0])
        assert platform_counters(first) == platform_counters(scrape(webs[1]))
        requests, delivered = received(receiver)
        assert delivered == Delivery.objects.filter(state=DeliveryState.DELIVERED).count()
        slug = agent.slug
        outcomes = ("delivered", "failed", "dead", "stale")
        assert value(first, "a2a_webhook_deliveries_total", agent=slug, outcome="delivered") == (
            delivered
        )
        attempts = sum(
            value(first, "a2a_webhook_deliveries_total", agent=slug, outcome=o) for o in outcomes
        )
        assert attempts == requests
        assert value(first, "a2a_webhook_delivery_latency_seconds_count", agent=slug) == delivered
        for state in ("submitted", "working", "completed"):
            assert value(first, "a2a_task_transitions_total", agent=slug, state=state) == 4
        assert value(first, "a2a_tasks_in_flight", agent=slug) == 0
        assert value(first, "a2a_webhook_backlog", agent=slug) == 0
        # Each web process served two of the sends; either one's scrape shows all four.
        sends = {"http_request_method": "POST", "http_route": SEND_ROUTE}
        for web in webs:
            wait_until(
                lambda web=web: (
                    value(
                        scrape(web),
                        "http_server_request_duration_seconds_count",
                        **sends,
                        http_response_status_code="200",
                    )
                    == 4
                ),
                message="both web processes' sends in the shared histogram",
            )

        # Django's views are timed under their URL pattern too (each web answered /readyz).
        readyz = {"http_request_method": "GET", "http_route": "/readyz"}
        assert (
            value(
                scrape(webs[0]),
                "http_server_request_duration_seconds_count",
                **readyz,
                http_response_status_code="200",
            )
            >= 2
        )

        # A worker restarts: nothing it counted was in its memory.
        workers[0].stop()
        workers[0] = start_worker(procs, name="w0-again", A2A_RETENTION_DAYS="0")
        configs += [send(webs[i % 2], agent, receiver.url, 4 + i) for i in range(2)]
        for config in configs[4:]:
            wait_all(config, timeout=30)
        restarted = scrape(webs[1])
        assert_never_lower(first, restarted)
        requests, delivered = received(receiver)
        assert value(
            restarted, "a2a_webhook_deliveries_total", agent=slug, outcome="delivered"
        ) == (delivered)
        assert value(restarted, "a2a_task_transitions_total", agent=slug, state="completed") == 6

        # Retention deletes every delivered delivery (with its attempts) and the finished
        # tasks' events; the counters stay where they were, on both web processes.
        purge_old_rows_job.delay()
        wait_until(
            lambda: (
                not Delivery.objects.filter(state=DeliveryState.DELIVERED).exists()
                and not TaskEvent.objects.filter(task__in=Task.objects.all()).exists()
            ),
            message="the purge",
        )
        for web in webs:
            purged = scrape(web)
            assert platform_counters(purged) == platform_counters(restarted)
            assert_never_lower(restarted, purged)
    finally:
        for web in webs:
            web.stop()
