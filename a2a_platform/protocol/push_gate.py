"""The push-registration gate as the protocol calls it: readiness read off the event loop,
the gate's refusals as protocol errors, and a config's check (its host resolved) before any
ORM call. The rule itself is webhooks.services.push_config_gate's."""

from __future__ import annotations

import asyncio

from django.conf import settings

from a2a_platform.lib.orm import run_orm
from a2a_platform.protocol.context import Ctx
from a2a_platform.protocol.errors import from_domain, invalid_params
from a2a_platform.protocol.params import Params


async def readiness_now():
    """This instance's readiness (cached ≤ A2A_READINESS_CACHE_SECONDS; a cache miss costs one
    short ORM call)."""
    from agents import readiness

    return readiness.cached_or_none() or await run_orm(readiness.current)


async def require_push(ctx: Ctx, *, registering: bool = True) -> None:
    """The push-registration gate (webhooks.services.push_config_gate, the one home of the
    rule), with readiness read off the event loop; its refusals as protocol errors."""
    from webhooks.services import push_config_gate

    state = await readiness_now() if registering and ctx.agent.push_notifications_enabled else None
    try:
        push_config_gate(agent=ctx.agent, registering=registering, readiness_now=state)
    except Exception as exc:
        mapped = from_domain(exc)
        if mapped is None:
            raise
        raise mapped from None


def _config_params(params: Params) -> Params:
    return {k: v for k, v in params.items() if k not in ("tenant", "taskId")}


async def checked_push_config(params: Params):
    """`push_config_check` before any ORM call: resolving the URL's host takes as long as its
    owner's DNS lets it, so it holds a thread of asyncio's default pool (never an ORM thread
    or an open transaction), and a lookup past A2A_WEBHOOK_CHECK_TIMEOUT_SECONDS refuses the
    registration (the lookup finishes unwaited)."""
    from webhooks.services import push_config_check

    timeout = settings.A2A_WEBHOOK_CHECK_TIMEOUT_SECONDS
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(push_config_check, _config_params(params)), timeout
        )
    except TimeoutError:
        raise invalid_params("url", f"its host did not resolve within {timeout:g} s") from None
