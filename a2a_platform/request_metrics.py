"""Request durations for `http_server_request_duration_seconds` (OpenTelemetry's HTTP server
metric, its attribute names written as Prometheus labels): timed around the whole ASGI app
(the protocol surface and Django alike), kept per process in memory, and added to the shared
rows (agents.RequestDuration) every A2A_METRICS_FLUSH_SECONDS and when the process stops, so
one scrape of any web process shows every process's requests.

The route is the pattern the request matched, never its path (ids and tenants would make a
series each): the protocol's own route table (`/{tenant}/tasks/{id}`), Django's URL pattern
(RouteMiddleware), or empty when nothing matched. `/metrics` itself is not timed: a scrape
would count itself. Off (A2A_METRICS_ENABLED false), asgi.py does not wrap the app at all.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field
from functools import reduce
from operator import or_

from django.db import transaction
from django.db.models import Q

from agents.models import RequestDuration

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
# OpenTelemetry's advice for http.server.request.duration (semantic conventions, HTTP metrics).
REQUEST_DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
# Any other method is `_OTHER` (the convention's rule: a client cannot mint series).
KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
# Where the matched route pattern travels from the router (or Django) to the timer.
ROUTE_KEY = "route"
ROUTE_MAX = 200  # RequestDuration.route's length

Key = tuple[str, str, int]  # method, route, status


@dataclass
class Series:
    """One (method, route, status)'s observations since the last flush."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(REQUEST_DURATION_BUCKETS) + 1))
    total_seconds: float = 0.0
    count: int = 0

    def add(self, other: Series) -> None:
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
        self.total_seconds += other.total_seconds
        self.count += other.count


class Pending:
    """This process's observations not yet flushed. Observed and swapped on the event loop's
    thread only (the ASGI app's), so it needs no lock."""

    def __init__(self) -> None:
        self.series: dict[Key, Series] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method if method in KNOWN_METHODS else "_OTHER", route[:ROUTE_MAX], status)
        series = self.series.get(key)
        if series is None:
            series = self.series[key] = Series()
        series.buckets[bisect.bisect_left(REQUEST_DURATION_BUCKETS, seconds)] += 1
        series.total_seconds += seconds
        series.count += 1

    def take(self) -> dict[Key, Series]:
        taken, self.series = self.series, {}
        return taken

    def put_back(self, taken: dict[Key, Series]) -> None:
        """A flush the database refused: its observations wait for the next one."""
        for key, series in taken.items():
            self.series.setdefault(key, Series()).add(series)


pending = Pending()


async def timed(app, scope, receive, send) -> None:
    """Serve one HTTP request through `app`, observing its duration (to the end of the
    response body, streams included) under its method, route and status."""
    if scope["path"] == METRICS_PATH:
        await app(scope, receive, send)
        return
    started = time.perf_counter()
    status = 500  # an app that raised before answering: the server answers 500

    async def send_status(message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await app(scope, receive, send_status)
    finally:
        pending.observe(
            scope["method"], scope.get(ROUTE_KEY, ""), status, time.perf_counter() - started
        )


class RouteMiddleware:
    """Puts the Django URL pattern a request matched into its ASGI scope (`/api/v1/tasks/
    <uuid:task_id>`), where `timed` reads it. Installed only with metrics on (settings)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs) -> None:
        scope = getattr(request, "scope", None)
        match = request.resolver_match
        if scope is not None and match is not None:
            scope[ROUTE_KEY] = "/" + match.route


def request_durations_flush(taken: dict[Key, Series]) -> None:
    """Add `taken` to the shared rows in one transaction: create the missing rows at zero,
    then lock them in pk order (every web process flushes the same few rows) and add."""
    if not taken:
        return
    with transaction.atomic():
        RequestDuration.objects.bulk_create(
            [
                RequestDuration(method=m, route=r, status=s, buckets=Series().buckets)
                for m, r, s in taken
            ],
            ignore_conflicts=True,
        )
        match = reduce(or_, (Q(method=m, route=r, status=s) for m, r, s in taken))
        rows = RequestDuration.objects.select_for_update().filter(match).order_by("pk")
        for row in rows:
            series = taken[(row.method, row.route, row.status)]
            stored = Series(list(row.buckets), row.total_seconds, row.count)
            stored.add(series)
            row.buckets, row.total_seconds, row.count = (
                stored.buckets,
                stored.total_seconds,
                stored.count,
            )
            row.save(update_fields=["buckets", "total_seconds", "count"])


async def flush_pending() -> None:
    """Flush this process's observations from async code; kept for the next flush when the
    database refuses them."""
    from a2a_platform.lib.orm import run_orm

    taken = pending.take()
    if not taken:
        return
    try:
        await run_orm(lambda: request_durations_flush(taken))
    except Exception:
        pending.put_back(taken)
        raise


async def flush_periodically(seconds: float) -> None:
    """The web process's flusher, until cancelled (the lifespan's shutdown flushes once more)."""
    import asyncio

    failing = False
    while True:
        await asyncio.sleep(seconds)
        try:
            await flush_pending()
            failing = False
        except Exception:
            if not failing:  # once per outage
                logger.warning("request durations not flushed; trying again", exc_info=True)
            failing = True
