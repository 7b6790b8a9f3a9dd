"""ASGI entry point: Django, behind a small router that owns the lifespan.

At startup the router starts this process's event hub (so readiness can report it and the
first waiter does not pay for the connection); at shutdown it stops it. The A2A wire surface
(a2a_platform/protocol) is served here beside Django, so a blocking SendMessage (and later a
stream) holds neither a thread nor a database connection while it waits; everything else
(admin, REST API, health) is Django.
"""

import logging
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "a2a_platform.settings")
django_app = get_asgi_application()

logger = logging.getLogger(__name__)


async def _lifespan(receive, send) -> None:
    from tasks.event_hub import get_hub

    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await get_hub().start()
            except Exception:
                logger.warning("event hub did not start; it keeps retrying", exc_info=True)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await get_hub().stop()
            await send({"type": "lifespan.shutdown.complete"})
            return


from a2a_platform.protocol import app as protocol  # noqa: E402 (needs Django set up)


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    route = protocol.route_for(scope)
    if route is not None:
        await protocol.handle(route, scope, receive, send)
        return
    await django_app(scope, receive, send)
