"""`GET /metrics`: the platform's figures in Prometheus text exposition (docs/observability.md,
"Metrics"), the same whichever web process is scraped.

Every figure is read from the database at scrape time, never kept in a process's memory:

- counters are the rows that record what they count (an attempt row per delivery attempt with
  its outcome, a status event per task state change, a dispatch per executor run) aggregated
  per agent, plus what retention deleted of them (agents.MetricBase, folded in by the purge
  in the transaction that deletes the rows), read in one snapshot so a purge committing
  mid-scrape neither drops nor doubles a count: they never go down, whatever restarts;
- gauges come from the selectors the operators' dashboard reads (webhooks.selectors,
  agents.readiness, tasks.selectors): one computation per figure for both;
- request durations are the web processes' shared histogram (a2a_platform/request_metrics.py).

Exposition is prometheus_client's (a custom collector yielding metric families). No
`_created` series: a counter here has no creation time of its own (it spans processes and
retention), and Prometheus does not need one.
"""

from __future__ import annotations

import hmac
import logging
from collections import defaultdict
from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from a2a_platform.celery import app as celery_app
from a2a_platform.request_metrics import REQUEST_DURATION_BUCKETS
from agents import readiness as gate
from agents.models import Agent, MetricBase, RequestDuration
from tasks.models import TaskEvent
from tasks.selectors import (
    TRANSITIONS_FAMILY,
    consistent_reads,
    executor_failures_per_agent,
    tasks_in_flight_per_agent,
    transition_tallies,
)
from tasks.states import TaskState
from webhooks.models import AttemptOutcome, DeliveryAttempt, RebindState
from webhooks.rebinds.machine import deadline_used
from webhooks.selectors import (
    DELIVERIES_FAMILY,
    DELIVERY_LATENCY_BUCKETS,
    ENDPOINT_TROUBLES,
    LATENCY_FAMILY,
    Tallies,
    attempt_tallies,
    delivery_backlog,
    latency_label,
    open_rebinds_progress,
    troubled_endpoints_per_agent,
)

logger = logging.getLogger(__name__)


def counter_tallies() -> Tallies:
    """Every counter family's figures: what retention deleted (agents.MetricBase) plus the
    same tallies over the rows still stored. Call inside `consistent_reads`."""
    total: Tallies = defaultdict(int)
    for family, agent, label, value in MetricBase.objects.values_list(
        "family", "agent_id", "label", "value"
    ):
        total[(family, agent, label)] += value
    live = (
        attempt_tallies(DeliveryAttempt.objects.all()),
        transition_tallies(TaskEvent.objects.all()),
    )
    for tallies in live:
        for key, value in tallies.items():
            total[key] += value
    return total


class PlatformCollector(Collector):
    """The platform's metric families, read from the database on each scrape."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        checks = gate.instance_checks(gate.instance_readiness())
        with consistent_reads():
            agents = dict(Agent.objects.order_by("slug").values_list("pk", "slug"))
            tallies = counter_tallies()
            failures = executor_failures_per_agent()
            backlog = delivery_backlog()
            troubled = troubled_endpoints_per_agent()
            in_flight = tasks_in_flight_per_agent()
            workers = gate.worker_liveness(now)
            rebinds = open_rebinds_progress()
            durations = list(
                RequestDuration.objects.order_by("method", "route", "status").values_list(
                    "method", "route", "status", "buckets", "total_seconds", "count"
                )
            )

        deliveries = CounterMetricFamily(
            "a2a_webhook_deliveries",
            "Webhook delivery attempts by outcome (delivered: a 2xx; failed: tried again later; "
            "dead: given up; stale: answered after its lease passed).",
            labels=["agent", "outcome"],
        )
        latency = HistogramMetricFamily(
            "a2a_webhook_delivery_latency_seconds",
            "Time from the event's write (with its task change) to the receiver's 2xx.",
            labels=["agent"],
        )
        transitions = CounterMetricFamily(
            "a2a_task_transitions",
            "Task state changes, by the state entered (a task's creation enters submitted).",
            labels=["agent", "state"],
        )
        executor_failures = CounterMetricFamily(
            "a2a_executor_failures",
            "Executor runs that failed: the dispatch gave up (executor lost) or the run raised.",
            labels=["agent"],
        )
        owed = GaugeMetricFamily(
            "a2a_webhook_backlog",
            "Webhook deliveries owed now: pending, sending and held.",
            labels=["agent"],
        )
        oldest = GaugeMetricFamily(
            "a2a_webhook_oldest_pending_seconds",
            "Age of the oldest delivery owed (0 when none is).",
            labels=["agent"],
        )
        dead = GaugeMetricFamily(
            "a2a_webhook_dead_letters",
            "Deliveries dead-lettered now (given up, not replayed).",
            labels=["agent"],
        )
        breaker = GaugeMetricFamily(
            "a2a_webhook_endpoints_breaker_open",
            "Receiver endpoints of the agent's push configs in trouble: breaker (a failure "
            "streak: one try in flight at a time) or paused (by an operator).",
            labels=["agent", "reason"],
        )
        tasks = GaugeMetricFamily(
            "a2a_tasks_in_flight", "Tasks not in a terminal state.", labels=["agent"]
        )
        for pk, slug in agents.items():
            for outcome in AttemptOutcome.values:
                count = tallies.get((DELIVERIES_FAMILY, pk, outcome), 0)
                deliveries.add_metric([slug, outcome], count)
            latency.add_metric(
                [slug],
                buckets=[
                    (
                        floatToGoString(bound),
                        tallies.get((LATENCY_FAMILY, pk, latency_label(bound)), 0),
                    )
                    for bound in DELIVERY_LATENCY_BUCKETS
                ]
                + [("+Inf", tallies.get((LATENCY_FAMILY, pk, "count"), 0))],
                sum_value=tallies.get((LATENCY_FAMILY, pk, "sum"), 0) / 1_000_000,
            )
            for task_state in TaskState:
                transitions.add_metric(
                    [slug, task_state.short],
                    tallies.get((TRANSITIONS_FAMILY, pk, task_state.short), 0),
                )
            executor_failures.add_metric([slug], failures.get(pk, 0))
            figures = backlog.get(pk)
            owed.add_metric([slug], figures.owed if figures else 0)
            oldest_at = figures.oldest_owed_at if figures else None
            oldest.add_metric([slug], (now - oldest_at).total_seconds() if oldest_at else 0)
            dead.add_metric([slug], figures.dead if figures else 0)
            for reason in ENDPOINT_TROUBLES:
                breaker.add_metric([slug, reason], troubled.get((pk, reason), 0))
            tasks.add_metric([slug], in_flight.get(pk, 0))
        yield from (deliveries, latency, transitions, executor_failures)
        yield from (owed, oldest, dead, breaker, tasks)

        readiness = GaugeMetricFamily(
            "a2a_readiness",
            "1 when the readiness check passes, else 0 (the scraped instance's gate, as /readyz "
            "and the dashboard show it).",
            labels=["check"],
        )
        for check in checks:
            readiness.add_metric([check.name], 1 if check.ok else 0)
        yield readiness

        live = GaugeMetricFamily(
            "a2a_workers_live",
            "Workers with a fresh heartbeat consuming the queue.",
            labels=["queue"],
        )
        queues = sorted({q.name for q in celery_app.conf.task_queues})
        for queue in queues:
            live.add_metric([queue], sum(1 for w, ok in workers if ok and queue in w.queues))
        yield live

        on_old = GaugeMetricFamily(
            "a2a_rebind_tasks_on_old_version",
            "Open rebinds: live tasks still on the old channel version.",
            labels=["rebind"],
        )
        ratio = GaugeMetricFamily(
            "a2a_rebind_drain_deadline_ratio",
            "Draining rebinds: time since the cutoff over the span to the deadline (1 at it).",
            labels=["rebind"],
        )
        for progress in rebinds:
            rebind = progress.rebind
            on_old.add_metric([str(rebind.pk)], progress.on_old)
            if rebind.state == RebindState.DRAINING and rebind.cutoff and rebind.deadline:
                elapsed = (now - rebind.cutoff).total_seconds()
                span = (rebind.deadline - rebind.cutoff).total_seconds()
                ratio.add_metric([str(rebind.pk)], deadline_used(elapsed, span))
        yield from (on_old, ratio)

        requests = HistogramMetricFamily(
            "http_server_request_duration_seconds",
            "Duration of HTTP server requests (API, protocol, console), every web process's.",
            labels=["http_request_method", "http_route", "http_response_status_code"],
        )
        for method, route, status, buckets, total_seconds, count in durations:
            cumulative, running = [], 0
            for bound, n in zip(REQUEST_DURATION_BUCKETS, buckets, strict=False):
                running += n
                cumulative.append((floatToGoString(bound), running))
            cumulative.append(("+Inf", count))
            requests.add_metric([method, route, str(status)], cumulative, total_seconds)
        yield requests


_registry: CollectorRegistry | None = None


def exposition(accept: str) -> tuple[bytes, str]:
    """The scrape's body and content type: the format the scraper's Accept header asks for
    (prometheus_client's negotiation: OpenMetrics when asked for, else the text format
    0.0.4)."""
    global _registry
    if _registry is None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(PlatformCollector())
        _registry = registry
    encoder, content_type = choose_encoder(accept)
    return encoder(_registry), content_type


def _refusal(message: str, status: int) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = "no-store"
    return response


def _authorized(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # Compared in constant time, as bytes (compare_digest refuses non-ASCII text).
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not settings.A2A_METRICS_ENABLED:
        return _refusal("metrics are off on this platform (A2A_METRICS_ENABLED)", 404)
    token = settings.A2A_METRICS_TOKEN
    if token and not _authorized(request, token):
        response = _refusal(
            "401 Unauthorized: /metrics needs the header `Authorization: Bearer <token>` "
            "with the platform's A2A_METRICS_TOKEN",
            401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    try:
        body, content_type = exposition(request.headers.get("Accept", ""))
    except DatabaseError:
        logger.warning("metrics not read: the database refused", exc_info=True)
        response = _refusal("503 Service Unavailable: the database cannot be read now", 503)
        response["Retry-After"] = "5"
        return response
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
