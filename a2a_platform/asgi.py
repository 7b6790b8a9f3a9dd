"""ASGI entry point: Django, behind a small router that owns the lifespan.

At startup the router starts this process's event hub (so readiness can report it and the
first waiter does not pay for the connection) and its heartbeat for the operators' dashboard
(its readiness, written every A2A_WEB_HEARTBEAT_SECONDS: agents.WebInstance); at shutdown it
stops both. The A2A wire surface
(a2a_platform/protocol) is served here beside Django, so a blocking SendMessage or an SSE
stream holds neither a thread nor a database connection while it waits; everything else
(admin, REST API, health) is Django. Once started, the process's start-up heap is frozen
out of the garbage collector's full passes (a2a_platform/lib/gc_freeze.py). On SIGTERM
(and at lifespan shutdown) open streams are ended with a `retry:` hint so their clients
resume on another instance.
"""

import contextlib
import logging
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")
django_app = get_asgi_application()

logger = logging.getLogger(__name__)


def _drain_on_sigterm() -> None:
    """Rolling deploys: on SIGTERM turn not-ready at once (card and /readyz answer 503, so the
    load balancer stops routing here), and only after A2A_SHUTDOWN_GRACE_SECONDS hand the
    signal to the server, which stops accepting and drains open requests."""
    import asyncio
    import signal

    from django.conf import settings

    from agents.readiness import start_draining

    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):
        return
    loop = asyncio.get_running_loop()

    def on_sigterm(signum, frame) -> None:
        start_draining()
        logger.info("SIGTERM: not ready now, draining after the grace period")
        loop.call_soon_threadsafe(
            loop.call_later, settings.A2A_SHUTDOWN_GRACE_SECONDS, previous, signum, frame
        )

    signal.signal(signal.SIGTERM, on_sigterm)


async def _heartbeat(name: str, started_at) -> None:
    """This instance's readiness, written for the dashboard until the process stops. A beat
    the database refuses (an outage) is skipped: the row goes stale, which the dashboard
    shows, and the next beat after the outage writes it again."""
    import asyncio

    from django.conf import settings

    from a2a_platform.lib.orm import run_orm
    from agents import readiness

    failing = False
    while True:
        try:
            await run_orm(
                lambda: readiness.web_instance_beat(
                    name=name, started_at=started_at, state=readiness.instance_readiness()
                )
            )
            failing = False
        except Exception:
            if not failing:  # once per outage, not every beat
                logger.warning("web heartbeat not written; trying again", exc_info=True)
            failing = True
        await asyncio.sleep(settings.A2A_WEB_HEARTBEAT_SECONDS)


async def _lifespan(receive, send) -> None:
    import asyncio

    from django.utils import timezone

    from a2a_platform.lib.gc_freeze import freeze_startup_heap
    from a2a_platform.protocol import sse
    from agents.readiness import instance_name
    from tasks.event_hub import get_hub

    heartbeat = flusher = None

    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await get_hub().start()
            except Exception:
                logger.warning("event hub did not start; it keeps retrying", exc_info=True)
            # Outside the main thread (embedded servers) there is no SIGTERM to wrap. Open
            # streams end (with a `retry:` hint) when the server is told to stop: hooked first,
            # so the readiness drain below delays that by its grace period.
            with contextlib.suppress(ValueError):
                sse.install_signal_hooks()
            with contextlib.suppress(ValueError):
                _drain_on_sigterm()
            name = instance_name()
            heartbeat = asyncio.create_task(_heartbeat(name, timezone.now()))
            if settings.A2A_METRICS_ENABLED:
                flusher = asyncio.create_task(
                    request_metrics.flush_periodically(settings.A2A_METRICS_FLUSH_SECONDS)
                )
            freeze_startup_heap()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            sse.begin_shutdown()  # servers that do not wait for open responses first
            if heartbeat is not None:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat
            if flusher is not None:
                flusher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flusher
                try:  # what this process served since its last flush
                    await request_metrics.flush_pending()
                except Exception:
                    logger.warning("request durations lost at shutdown", exc_info=True)
            await get_hub().stop()
            await send({"type": "lifespan.shutdown.complete"})
            return


from django.conf import settings  # noqa: E402

from a2a_platform import request_metrics  # noqa: E402 (needs Django set up)
from a2a_platform.protocol import app as protocol  # noqa: E402


async def _serve(scope, receive, send):
    route = protocol.route_for(scope)
    if route is not None:
        scope[request_metrics.ROUTE_KEY] = route.template
        await protocol.handle(route, scope, receive, send)
        return
    await django_app(scope, receive, send)


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    elif scope["type"] == "http" and settings.A2A_METRICS_ENABLED:
        await request_metrics.timed(_serve, scope, receive, send)
    else:  # metrics off: not timed at all
        await _serve(scope, receive, send)
