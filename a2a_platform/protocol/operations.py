"""The 9 unary A2A operations, binding-independent: ProtoJSON params in, ProtoJSON result out
(the two streaming ones are in streams.py; routes.METHODS joins both tables).

Each handler parses its request with the official protobuf type, calls selectors or one
service in a short ORM call (`run_orm`: the connection goes back to the pool at once), and
renders. Blocking SendMessage waits on the event hub holding neither a thread nor a
connection.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from a2a.types import a2a_pb2
from django.conf import settings

from a2a_platform.lib.orm import Coalesced, run_orm
from a2a_platform.protocol.context import ANONYMOUS, Ctx
from a2a_platform.protocol.errors import (
    TASK_NOT_FOUND,
    UNAUTHENTICATED,
    UNSUPPORTED_OPERATION,
    ProtocolError,
    from_domain,
    invalid_params,
    orm,
)
from a2a_platform.protocol.params import Params, parse_history_length, parse_request
from a2a_platform.protocol.push_gate import checked_push_config, readiness_now, require_push
from a2a_platform.protocol.visibility import snapshot, visible_task
from a2a_platform.protocol.writes import Accepted, accept_message, card_url
from agents.card_render import agent_base_url, jwks_url, render_card
from agents.models import AnonymousListing
from agents.readiness import capabilities as agent_capabilities
from tasks import selectors, services, wire
from tasks.errors import TaskNotFound
from tasks.event_hub import get_hub
from tasks.models import Task
from webhooks.selectors import push_channel_extension

# --- SendMessage ---------------------------------------------------------------------------


async def send_message(ctx: Ctx, params: Params) -> dict:
    accepted = await accept_message(ctx, params, wake_on_new=True)
    try:
        return await _answer(ctx, accepted)
    finally:
        accepted.release_wake()


async def _answer(ctx: Ctx, accepted: Accepted) -> dict:
    result, history_length = accepted.result, accepted.history_length
    task_id = result.task.pk
    if accepted.return_immediately and result.first_message is not None:
        # A task created by this very call: everything to render is in hand (no queries).
        history = [result.first_message] if history_length != 0 else None
        return {"task": wire.task_json(result.task, history=history)}

    def render(found: selectors.Snapshot | None) -> dict:
        if found is None:
            raise TaskNotFound(task_id)
        task, history, artifacts = found
        if task.answered_with_message and task.status_message:
            return {"message": task.status_message}
        history = history if history_length != 0 else None
        return {"task": wire.task_json(task, history=history, artifacts=artifacts)}

    if not accepted.return_immediately:
        # A follow-up to an interrupted task finds it INPUT_REQUIRED: that is not the answer.
        follow_up = not result.created and not result.replayed
        after_seq = result.task.last_seq if follow_up else None

        key = selectors.SettledKey(
            ctx.agent.pk, ctx.principal, task_id, history_length, after_seq=after_seq
        )

        async def read_settled() -> tuple[bool, dict | None] | None:
            # Whether it settled and, if it did, the task, its history and artifacts, in
            # one read (one statement on PostgreSQL, shared with the other waiters woken in
            # the same turn), rendered here.
            found = await _settled(key)
            if found is None or not found[0]:
                return found
            return True, render(found[1])

        answer = await wait_until_settled(
            task_id,
            settings.A2A_SEND_MESSAGE_MAX_WAIT_SECONDS,
            read=read_settled,
            woken=accepted.woken,
        )
        if answer is not None:
            return answer

    # The task, its history and artifacts in one read (GetTask's).
    found = await _read_snapshot(ctx, task_id, history_length)
    if found is None:
        raise from_domain(TaskNotFound(task_id))
    return render(found)


async def wait_until_settled(
    task_id: object,
    max_wait: float,
    *,
    read: Callable[[], Awaitable[tuple[bool, dict | None] | None]],
    woken: asyncio.Future | None = None,
) -> dict | None:
    """Wait on the hub until the task has settled (terminal or interrupted), or `max_wait`
    passes. `read` (awaited once per wake-up) says whether it has settled and, if it has,
    gives the answer, read with it: (True, answer), (False, None), None
    when the task is gone. Returns the answer; None when the wait ended unsettled or the
    task is gone. `woken`: a subscription made before the task was written
    (writes.accept_message): until it fires the task is as written, so the first read waits
    for it.
    """
    deadline = time.monotonic() + max_wait
    hub = get_hub()
    if woken is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(woken), max_wait)

    def settled(found: tuple[bool, dict | None] | None) -> bool:
        return found is None or found[0]

    while True:
        # One read per wake-up: the hub subscribes before it reads (tasks/event_hub.py).
        remaining = deadline - time.monotonic()
        try:
            found = await hub.read_then_wait(task_id, read, enough=settled, timeout=remaining)
        except Exception as exc:
            mapped = from_domain(exc)
            if mapped is None:
                raise
            raise mapped from None
        if settled(found) or remaining <= 0:
            return found[1] if found is not None else None


# --- Tasks ---------------------------------------------------------------------------------


# The snapshot reads of one turn of the event loop, read together (one statement): GetTasks,
# and blocking sends' reads on a wake-up (an answered batch wakes its waiters together).
_snapshots = Coalesced(lambda keys: selectors.task_snapshots_for_owner(keys=keys))
_settled = Coalesced(lambda keys: selectors.task_settled_snapshots(keys=keys))


async def _read_snapshot(
    ctx: Ctx, task_id: object, history_length: int | None
) -> selectors.Snapshot | None:
    """The task visible to the caller with its history and artifacts (None: unknown or
    foreign), read with the other requests' in the same turn."""
    key = selectors.snapshot_key(
        agent_id=ctx.agent.pk, owner=ctx.principal, task_id=task_id, history_length=history_length
    )
    return await _snapshots(key) if key is not None else None


async def get_task(ctx: Ctx, params: Params) -> dict:
    req = parse_request(params, a2a_pb2.GetTaskRequest)
    if not req.id:
        raise invalid_params("id", "is required")
    found = await _read_snapshot(ctx, req.id, parse_history_length(req))
    if found is None:
        raise ProtocolError(TASK_NOT_FOUND, metadata={"taskId": req.id[:100]})
    task, history, artifacts = found
    return wire.task_json(task, history=history, artifacts=artifacts)


async def cancel_task(ctx: Ctx, params: Params) -> dict:
    req = parse_request(params, a2a_pb2.CancelTaskRequest)
    if not req.id:
        raise invalid_params("id", "is required")

    def cancel():
        task = visible_task(ctx, req.id)
        return snapshot(services.task_cancel(task_id=task.pk), history_length=None)

    return await orm(cancel)


def _encode_cursor(task: Task) -> str:
    raw = json.dumps({"t": task.status_timestamp.isoformat(), "i": str(task.pk)})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(token: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        return datetime.fromisoformat(data["t"]), str(data["i"])
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
        raise invalid_params("pageToken", "is not a token this server issued") from None


async def list_tasks(ctx: Ctx, params: Params) -> dict:
    req = parse_request(params, a2a_pb2.ListTasksRequest)
    page_size = req.page_size if req.HasField("page_size") else 50
    if not 1 <= page_size <= 100:
        raise invalid_params("pageSize", "must be between 1 and 100")
    history_length = parse_history_length(req)
    include_artifacts = req.include_artifacts if req.HasField("include_artifacts") else False
    if ctx.principal == ANONYMOUS and not req.context_id:
        # The agent's choice (Agent.anonymous_list_tasks, docs/protocol.md): refuse (the
        # default), list every anonymous caller's tasks (one principal), or an empty page.
        policy = ctx.agent.anonymous_list_tasks
        if policy == AnonymousListing.EMPTY:
            return {"tasks": [], "nextPageToken": "", "pageSize": page_size, "totalSize": 0}
        if policy != AnonymousListing.ANONYMOUS_TASKS:
            raise invalid_params(
                "contextId", "anonymous callers list only the tasks of a contextId they name"
            )
    cursor = _decode_cursor(req.page_token) if req.page_token else None
    after = None
    if req.HasField("status_timestamp_after"):
        after = req.status_timestamp_after.ToDatetime(tzinfo=UTC)

    state = None
    if req.status != a2a_pb2.TASK_STATE_UNSPECIFIED:
        state = a2a_pb2.TaskState.Name(req.status)

    def query():
        page = selectors.task_page(
            agent_id=ctx.agent.pk,
            owner=ctx.principal,
            page_size=page_size,
            context_id=req.context_id,
            state=state,
            status_after=after,
            after_key=cursor,
        )
        return {
            "tasks": [
                snapshot(t, history_length=history_length, include_artifacts=include_artifacts)
                for t in page.tasks
            ],
            "nextPageToken": _encode_cursor(page.tasks[-1]) if page.more else "",
            "pageSize": page_size,
            "totalSize": page.total,
        }

    return await orm(query)


# --- Push configs ---------------------------------------------------------------------------


async def create_push_config(ctx: Ctx, params: Params) -> dict:
    from webhooks.services import push_config_create, push_config_json

    await require_push(ctx)
    req = parse_request(params, a2a_pb2.TaskPushNotificationConfig)
    if not req.task_id:
        raise invalid_params("taskId", "is required")
    # The task first: a foreign or unknown task id is "task not found" whatever the URL.
    await orm(lambda: visible_task(ctx, req.task_id))
    checked = await checked_push_config(params)
    issuer = card_url(ctx)

    def write():
        task = visible_task(ctx, req.task_id)
        binding = push_config_create(task=task, config=checked, issuer=issuer)
        return push_config_json(binding)

    return await orm(write)


def _task_and_config_id(params: Params, proto_cls: type) -> tuple[str, str]:
    req = parse_request(params, proto_cls)
    if not req.task_id:
        raise invalid_params("taskId", "is required")
    return req.task_id, getattr(req, "id", "")


async def get_push_config(ctx: Ctx, params: Params) -> dict:
    from webhooks.selectors import current_binding
    from webhooks.services import push_config_json

    await require_push(ctx, registering=False)
    task_id, config_id = _task_and_config_id(params, a2a_pb2.GetTaskPushNotificationConfigRequest)
    if not config_id:
        raise invalid_params("id", "is required")
    return await orm(
        lambda: push_config_json(current_binding(visible_task(ctx, task_id), config_id))
    )


async def list_push_configs(ctx: Ctx, params: Params) -> dict:
    from webhooks.selectors import current_bindings
    from webhooks.services import push_config_json

    await require_push(ctx, registering=False)
    task_id, _ = _task_and_config_id(params, a2a_pb2.ListTaskPushNotificationConfigsRequest)

    def read():
        bindings = current_bindings(visible_task(ctx, task_id))
        return {"configs": [push_config_json(b) for b in bindings], "nextPageToken": ""}

    return await orm(read)


async def delete_push_config(ctx: Ctx, params: Params) -> dict:
    from webhooks.services import push_config_delete

    await require_push(ctx, registering=False)
    task_id, config_id = _task_and_config_id(
        params, a2a_pb2.DeleteTaskPushNotificationConfigRequest
    )
    if not config_id:
        raise invalid_params("id", "is required")
    await orm(lambda: push_config_delete(task=visible_task(ctx, task_id), config_id=config_id))
    return {}


# --- Cards ---------------------------------------------------------------------------------


def hub_connected() -> bool:
    """Whether this process's event hub is connected: streams ride it (read in the event loop
    that runs it)."""
    return get_hub().connected


def capabilities(ctx: Ctx, readiness, *, hub: bool | None = None) -> dict[str, bool]:
    """The card's capabilities for this agent right now (the rule: agents.readiness); `hub`:
    hub_connected(), when the caller has read it already."""
    connected = hub_connected() if hub is None else hub
    caps = agent_capabilities(ctx.agent, readiness, hub_connected=connected)
    return {name: cap.on for name, cap in caps.items()}


def public_card(ctx: Ctx, caps: dict[str, bool] | None = None) -> dict:
    """The card as rendered from the agent's row alone (no query)."""
    return render_card(ctx.agent, origin=ctx.origin, at_root=ctx.at_root, capabilities=caps)


def served_card(ctx: Ctx, caps: dict[str, bool]) -> dict:
    """The card clients get (in an ORM thread): with push notifications on, it declares the
    push-channel extension, whose params read the agent's keys and open rebinds."""
    platform = []
    if caps.get("pushNotifications", ctx.agent.push_notifications_enabled):
        base = agent_base_url(ctx.agent, ctx.origin, at_root=ctx.at_root)
        platform.append(push_channel_extension(ctx.agent, jwks_url=jwks_url(base)))
    return render_card(
        ctx.agent,
        origin=ctx.origin,
        at_root=ctx.at_root,
        capabilities=caps,
        platform_extensions=platform,
    )


async def get_extended_agent_card(ctx: Ctx, params: Params) -> dict:
    if not public_card(ctx)["capabilities"].get("extendedAgentCard"):
        raise ProtocolError(UNSUPPORTED_OPERATION, "this agent has no extended agent card")
    if not ctx.authenticated:
        raise ProtocolError(UNAUTHENTICATED, "the extended agent card needs an API key")
    caps = capabilities(ctx, await readiness_now())
    return await run_orm(lambda: served_card(ctx, caps))


UNARY = {
    "SendMessage": send_message,
    "GetTask": get_task,
    "ListTasks": list_tasks,
    "CancelTask": cancel_task,
    "CreateTaskPushNotificationConfig": create_push_config,
    "GetTaskPushNotificationConfig": get_push_config,
    "ListTaskPushNotificationConfigs": list_push_configs,
    "DeleteTaskPushNotificationConfig": delete_push_config,
    "GetExtendedAgentCard": get_extended_agent_card,
}
"""The unary operations; the streaming ones are streams.OPEN, both joined in routes.METHODS."""
