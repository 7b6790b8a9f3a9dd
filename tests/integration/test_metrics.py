"""/metrics in one process (a2a_platform/metrics.py): the token, the switch, what each family
counts, that retention never lowers a counter, that the dashboard and the metrics read the
same figures, and the shared request-duration histogram. Across real web and worker
processes: tests/integration/test_metrics_processes.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from a2a_platform.request_metrics import Pending, request_durations_flush
from agents.models import MetricBase
from tasks import services
from tasks.dispatch import dispatch_claim
from tasks.models import ExecutorDispatch, TaskEvent
from tasks.states import TaskState
from tasks.sweeper import dispatch_sweep
from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory
from tests.webhook_checks import configure, open_task
from webhooks.console.dashboard import dashboard_data
from webhooks.delivery.retention import purge_old_rows
from webhooks.delivery.transport import TransportResult
from webhooks.models import Delivery, DeliveryAttempt

# Committed: the scrape reads in a transaction of its own (REPEATABLE READ).
pytestmark = pytest.mark.django_db(transaction=True)

URL = "http://127.0.0.1:9/hook"
TOKEN = "s3cret-metrics-token"

Samples = dict[tuple[str, frozenset], float]


@pytest.fixture(autouse=True)
def _settings(settings):
    configure(settings)
    settings.A2A_METRICS_ENABLED = True
    settings.A2A_METRICS_TOKEN = ""
    settings.A2A_WEBHOOK_RETRY_SCHEDULE = ["0"]  # a failed try is due again at once


def scrape(client: Client | None = None, **headers: str) -> Samples:
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {key}"
    return samples[key]


def answer(status: int) -> TransportResult:
    """What the receiver (the far side) answered."""
    return TransportResult(
        status=status,
        headers={},
        body_excerpt="",
        duration_ms=3.0,
        error_class=None,
        retry_after=None,
    )


def deliver_next(config, status: int) -> None:
    claim = delivery_claim_head(config_pk=config.pk)
    assert claim is not None
    delivery_record(claim=claim, result=answer(status))


# --- the endpoint ----------------------------------------------------------------------------


def test_metrics_without_a_token_is_open_and_prometheus_text():
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    body = response.content.decode()
    assert "# TYPE a2a_webhook_deliveries_total counter" in body
    assert "a2a_webhook_deliveries_total{" not in body  # no agent yet, no series


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer", f"bearer{TOKEN}"],
)
def test_metrics_with_a_token_refuses_any_other_credential_with_401(settings, authorization):
    settings.A2A_METRICS_TOKEN = TOKEN
    headers = {"Authorization": authorization} if authorization else {}
    response = Client().get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert "Authorization: Bearer <token>" in response.content.decode()
    assert "a2a_" not in response.content.decode()


def test_metrics_with_a_token_answers_the_bearer_of_it(settings):
    settings.A2A_METRICS_TOKEN = TOKEN
    AgentFactory(slug="tok-bot", executor="external")
    samples = scrape(Authorization=f"Bearer {TOKEN}")
    assert value(samples, "a2a_tasks_in_flight", agent="tok-bot") == 0


def test_metrics_off_is_not_found_and_only_get_is_allowed(settings):
    assert Client().post("/metrics").status_code == 405
    settings.A2A_METRICS_ENABLED = False
    response = Client().get("/metrics")
    assert response.status_code == 404
    assert "A2A_METRICS_ENABLED" in response.content.decode()


# --- the families ----------------------------------------------------------------------------


def test_deliveries_are_counted_by_outcome_with_the_delivered_ones_latency():
    agent = AgentFactory(slug="count-bot", executor="external")
    task, (config,) = open_task(agent, "x", {"url": URL})
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    deliver_next(config, 200)  # the snapshot: delivered
    deliver_next(config, 503)  # working: failed, due again at once
    deliver_next(config, 400)  # working again: a final refusal, dead-lettered
    samples = scrape()

    def outcome(name: str) -> float:
        return value(samples, "a2a_webhook_deliveries_total", agent="count-bot", outcome=name)

    assert (outcome("delivered"), outcome("failed"), outcome("dead"), outcome("stale")) == (
        1,
        1,
        1,
        0,
    )
    assert value(samples, "a2a_webhook_delivery_latency_seconds_count", agent="count-bot") == 1
    assert value(
        samples, "a2a_webhook_delivery_latency_seconds_bucket", agent="count-bot", le="+Inf"
    ) == (1)
    latency = DeliveryAttempt.objects.get(outcome="delivered").latency_us
    assert latency is not None
    assert latency >= 3000  # at least the receiver's own answer time
    assert value(samples, "a2a_webhook_delivery_latency_seconds_sum", agent="count-bot") == (
        latency / 1_000_000
    )
    # Owed: the completed status (pending); dead: the working one.
    assert value(samples, "a2a_webhook_backlog", agent="count-bot") == 1
    assert value(samples, "a2a_webhook_dead_letters", agent="count-bot") == 1
    assert value(samples, "a2a_webhook_oldest_pending_seconds", agent="count-bot") >= 0
    for state, n in (("submitted", 1), ("working", 1), ("completed", 1), ("failed", 0)):
        assert value(samples, "a2a_task_transitions_total", agent="count-bot", state=state) == n
    assert value(samples, "a2a_tasks_in_flight", agent="count-bot") == 0
    # Two failures in a row: the endpoint's breaker is open (a failure streak).
    assert value(
        samples, "a2a_webhook_endpoints_breaker_open", agent="count-bot", reason="breaker"
    ) == (1)
    assert value(
        samples, "a2a_webhook_endpoints_breaker_open", agent="count-bot", reason="paused"
    ) == (0)


def test_a_purge_folds_what_it_deletes_into_the_base_and_no_counter_moves():
    agent = AgentFactory(slug="purge-bot", executor="external")
    for _ in range(2):
        task, (config,) = open_task(agent, "x", {"url": URL})
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
        for _ in range(3):
            deliver_next(config, 200)
    in_flight, _ = open_task(agent, "x", {"url": URL})  # its rows stay
    before = scrape()
    assert value(before, "a2a_webhook_deliveries_total", agent="purge-bot", outcome="delivered")

    purged = purge_old_rows(now=timezone.now() + timedelta(days=30))

    assert purged.deliveries == 6
    assert purged.events == 6
    assert not DeliveryAttempt.objects.filter(delivery__task__agent=agent).exists()
    assert TaskEvent.objects.filter(task__agent=agent).count() == 1  # the live task's
    assert MetricBase.objects.filter(agent=agent).exists()
    after = scrape()
    counted = {k: v for k, v in before.items() if k[0].endswith(("_total", "_bucket", "_sum"))}
    assert counted
    assert {k: after[k] for k in counted} == counted
    assert value(after, "a2a_tasks_in_flight", agent="purge-bot") == 1
    assert Delivery.objects.filter(task=in_flight).exists()


def test_the_dashboard_and_the_metrics_show_the_same_figures():
    agent = AgentFactory(slug="same-bot", executor="external")
    task, (config,) = open_task(agent, "x", {"url": URL})
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    deliver_next(config, 400)  # the snapshot, dead-lettered
    samples = scrape()
    data = dashboard_data()
    (row,) = [a for a in data["agents"] if a["slug"] == "same-bot"]
    figures = row["deliveries"]
    assert value(samples, "a2a_webhook_dead_letters", agent="same-bot") == figures["dead"] == 1
    assert value(samples, "a2a_webhook_backlog", agent="same-bot") == (
        figures["queueDepth"] + figures["held"]
    )
    assert data["endpoints"]["failing"] == value(
        samples, "a2a_webhook_endpoints_breaker_open", agent="same-bot", reason="breaker"
    )
    for check in data["readiness"]["checks"]:
        assert value(samples, "a2a_readiness", check=check["name"]) == (1 if check["ok"] else 0)
    for queue in ("agents", "webhooks", "heartbeat"):
        live = sum(1 for w in data["readiness"]["workers"] if w["live"] and queue in w["queues"])
        assert value(samples, "a2a_workers_live", queue=queue) == live


# --- request durations -----------------------------------------------------------------------


def test_request_durations_from_two_processes_add_up_in_the_shared_histogram():
    first, second = Pending(), Pending()
    first.observe("GET", "/{tenant}/tasks/{id}", 200, 0.004)
    first.observe("GET", "/{tenant}/tasks/{id}", 200, 0.3)
    second.observe("GET", "/{tenant}/tasks/{id}", 200, 20.0)
    second.observe("BREW", "/", 405, 0.01)  # a method nobody defined: one series for all
    request_durations_flush(first.take())
    request_durations_flush(second.take())
    assert first.series == second.series == {}
    samples = scrape()
    task = {
        "http_request_method": "GET",
        "http_route": "/{tenant}/tasks/{id}",
        "http_response_status_code": "200",
    }
    name = "http_server_request_duration_seconds"
    assert value(samples, f"{name}_count", **task) == 3
    assert value(samples, f"{name}_sum", **task) == pytest.approx(20.304)
    assert value(samples, f"{name}_bucket", **task, le="0.005") == 1
    assert value(samples, f"{name}_bucket", **task, le="0.5") == 2
    assert value(samples, f"{name}_bucket", **task, le="10.0") == 2
    assert value(samples, f"{name}_bucket", **task, le="+Inf") == 3
    other = {
        "http_request_method": "_OTHER",
        "http_route": "/",
        "http_response_status_code": "405",
    }
    assert value(samples, f"{name}_count", **other) == 1


def test_a_refused_flush_keeps_its_observations_for_the_next_one():
    pending = Pending()
    pending.observe("POST", "/", 200, 0.1)
    taken = pending.take()
    pending.observe("POST", "/", 200, 0.2)
    pending.put_back(taken)
    (series,) = pending.series.values()
    assert series.count == 2
    assert series.total_seconds == pytest.approx(0.3)


def test_a_dispatch_that_ran_out_of_tries_is_an_executor_failure(settings):
    """Each claim whose lease lapsed (its worker gone) is a try; after the last the sweeper
    fails the task (executor lost): one executor failure, one transition to failed."""
    settings.A2A_DISPATCH_LEASE_SECONDS = 0
    agent = AgentFactory(slug="lost-bot", executor="external")
    task, _ = open_task(agent, "x")
    dispatch = ExecutorDispatch.objects.get(task=task)
    before = scrape()
    assert value(before, "a2a_executor_failures_total", agent="lost-bot") == 0
    for attempt in range(settings.A2A_DISPATCH_MAX_TRIES):
        assert dispatch_claim(dispatch_id=dispatch.pk, worker=f"gone:{attempt}")
        dispatch_sweep()
    samples = scrape()
    assert value(samples, "a2a_executor_failures_total", agent="lost-bot") == 1
    assert value(samples, "a2a_task_transitions_total", agent="lost-bot", state="failed") == 1
    assert value(samples, "a2a_tasks_in_flight", agent="lost-bot") == 0


def test_openmetrics_when_the_scraper_asks_for_it_without_created_series():
    agent = AgentFactory(slug="om-bot", executor="external")
    open_task(agent, "x")
    response = Client().get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    body = response.content.decode()
    assert body.endswith("# EOF\n")
    assert "_created" not in body
    families = {f.name: f for f in openmetrics_families(body)}
    (sample,) = [
        s
        for s in families["a2a_task_transitions"].samples
        if s.labels == {"agent": "om-bot", "state": "submitted"}
    ]
    assert (sample.name, sample.value) == ("a2a_task_transitions_total", 1)
