"""The 11 A2A operations, binding-independent: ProtoJSON params in, ProtoJSON result out.

Each handler parses its request with the official protobuf type, calls selectors or one
service in a short ORM call (`run_orm`: the connection goes back to the pool at once), and
renders. Blocking SendMessage waits on the event hub holding neither a thread nor a
connection.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from a2a.types import a2a_pb2
from django.conf import settings
from google.protobuf import json_format

from a2a_platform.lib.orm import run_orm
from a2a_platform.lib.ttl_cache import TTLCache
from a2a_platform.protocol.context import ANONYMOUS, Ctx
from a2a_platform.protocol.errors import (
    CONTENT_TYPE_NOT_SUPPORTED,
    PUSH_NOT_SUPPORTED,
    TASK_NOT_FOUND,
    UNAUTHENTICATED,
    UNAVAILABLE,
    UNSUPPORTED_OPERATION,
    ProtocolError,
    from_domain,
    invalid_params,
)
from agents.card import render_card
from tasks import services, wire
from tasks.event_hub import get_hub
from tasks.models import EventKind, Task, TaskEvent
from tasks.states import SETTLED_STATES, TaskState

Params = dict[str, Any]


def parse_request(params: Any, proto_cls: type) -> Any:
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise invalid_params("params", "must be a JSON object")
    try:
        return wire.parse_dict(params, proto_cls)
    except json_format.ParseError as exc:
        text = str(exc).splitlines()[0]
        raise invalid_params(_error_path(text), text[:300]) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise invalid_params("params", f"invalid value: {exc}"[:300]) from None


def _error_path(parse_error: str) -> str:
    """`... at SendMessageRequest.message.role.` -> `message.role` (the offending field)."""
    _, sep, where = parse_error.rpartition(" at ")
    path = where.rstrip(".").split(".", 1)
    if sep and len(path) == 2 and path[1]:
        return path[1]
    chain = re.findall(r"Failed to parse (\w+) field", parse_error)
    return ".".join(chain) or "params"


async def orm(fn):
    """Run a short ORM call; map domain errors to protocol errors."""
    try:
        return await run_orm(fn)
    except Exception as exc:
        mapped = from_domain(exc)
        if mapped is None:
            raise
        raise mapped from None


def _history_length(req: Any, field: str = "history_length") -> int | None:
    if not req.HasField(field):
        return None
    value = getattr(req, field)
    if value < 0:
        raise invalid_params("historyLength", "must not be negative")
    return value


def snapshot(task: Task, *, history_length: int | None, include_artifacts: bool = True) -> dict:
    """Task as ProtoJSON: history per historyLength (None all, 0 none, N newest N)."""
    from tasks.selectors import task_artifacts, task_history

    history = task_history(task, history_length) if history_length != 0 else None
    artifacts = task_artifacts(task) if include_artifacts else None
    return wire.task_json(task, history=history, artifacts=artifacts)


def _visible_task(ctx: Ctx, task_id: str) -> Task:
    from tasks.selectors import task_for_owner

    task = task_for_owner(agent_id=ctx.agent.pk, owner=ctx.principal, task_id=task_id)
    if task is None:
        raise ProtocolError(TASK_NOT_FOUND, metadata={"taskId": task_id[:100]})
    return task


def _media_match(accepted: str, offered: str) -> bool:
    a_type, _, a_sub = accepted.partition("/")
    o_type, _, o_sub = offered.partition("/")
    return a_type in ("*", o_type) and a_sub in ("*", o_sub, "")


def _check_output_modes(ctx: Ctx, accepted: list[str]) -> None:
    offered = ctx.agent.default_output_modes or ["text/plain"]
    if accepted and not any(_media_match(a, o) for a in accepted for o in offered):
        raise ProtocolError(
            CONTENT_TYPE_NOT_SUPPORTED,
            "none of acceptedOutputModes is produced by this agent",
            metadata={"offered": ",".join(offered)},
        )


def _check_input_parts(ctx: Ctx, message: a2a_pb2.Message) -> None:
    accepted = ctx.agent.default_input_modes or []
    if not accepted:
        return
    for i, part in enumerate(message.parts):
        media = part.media_type or ("text/plain" if part.WhichOneof("content") == "text" else "")
        if media and not any(_media_match(a, media) for a in accepted):
            raise ProtocolError(
                CONTENT_TYPE_NOT_SUPPORTED,
                f"message.parts[{i}]: media type {media[:100]!r} is not accepted by this agent",
                metadata={"accepted": ",".join(accepted)},
            )


def _request_hash(params: Params) -> str:
    body = {k: v for k, v in params.items() if k != "tenant"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


# --- SendMessage ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Accepted:
    """A client message written by SendMessage or SendStreamingMessage."""

    result: services.SendResult
    history_length: int | None
    return_immediately: bool
    snapshot: dict | None = None  # the task as of this write, rendered in its transaction


async def accept_message(ctx: Ctx, params: Params, *, render_snapshot: bool = False) -> Accepted:
    """Validate and write a client message: the one write path of SendMessage and
    SendStreamingMessage (a new task or a follow-up, its inline push config and the
    idempotency receipt in one transaction). `render_snapshot`: also render the task exactly
    as of this write, inside the transaction (a stream's cursor starts there)."""
    req = parse_request(params, a2a_pb2.SendMessageRequest)
    if not req.HasField("message"):
        raise invalid_params("message", "is required")
    config = req.configuration
    history_length = _history_length(config) if req.HasField("configuration") else None
    raw_push = None
    if config.HasField("task_push_notification_config"):
        await _require_push(ctx)
        # The config as the client sent it, even `{}`: push_config_check then names what
        # is missing (a falsy `or` here dropped an empty config, and the task had no webhook).
        given = params["configuration"]
        key = "taskPushNotificationConfig"
        raw_push = given[key] if key in given else given["task_push_notification_config"]
    # Validate the message as the client sent it (base64, lengths, parts), not re-encoded.
    msg = wire.parse_message(params["message"])
    if msg.role != a2a_pb2.ROLE_USER:
        raise invalid_params("message.role", "a client message must have role ROLE_USER")
    _check_output_modes(ctx, list(config.accepted_output_modes))
    _check_input_parts(ctx, msg)
    request_hash = _request_hash(params) if ctx.principal != ANONYMOUS else None
    metadata = json_format.MessageToDict(req.metadata) if req.HasField("metadata") else None
    inline_push = None if raw_push is None else await _checked_push_config(raw_push)
    issuer = _card_url(ctx)

    def write():
        from webhooks.services import push_config_create

        written = None

        def within(result: services.SendResult) -> None:
            # In the send's transaction: a task is never accepted with its webhook dropped.
            nonlocal written
            if inline_push is not None:
                push_config_create(task=result.task, config=inline_push, issuer=issuer)
            if render_snapshot:
                written = _written_snapshot(result, history_length)

        result = services.task_send(
            agent=ctx.agent,
            owner=ctx.principal,
            message=msg,
            request_hash=request_hash,
            metadata=metadata,
            card_version_id=_card_version_id(ctx.agent),
            within=within,
        )
        return Accepted(result, history_length, config.return_immediately, written)

    return await orm(write)


def _written_snapshot(result: services.SendResult, history_length: int | None) -> dict:
    if result.first_message is not None:
        # A task created by this very write: everything to render is in hand (no queries).
        history = [result.first_message] if history_length != 0 else None
        return wire.task_json(result.task, history=history)
    return snapshot(result.task, history_length=history_length)


async def send_message(ctx: Ctx, params: Params) -> dict:
    accepted = await accept_message(ctx, params)
    result, history_length = accepted.result, accepted.history_length
    task_id = result.task.pk
    if accepted.return_immediately and result.first_message is not None:
        # A task created by this very call: everything to render is in hand (no queries).
        history = [result.first_message] if history_length != 0 else None
        return {"task": wire.task_json(result.task, history=history)}
    if not accepted.return_immediately:
        # A follow-up to an interrupted task finds it INPUT_REQUIRED: that is not the answer.
        follow_up = not result.created and not result.replayed
        await wait_until_settled(
            task_id,
            settings.A2A_SEND_MESSAGE_MAX_WAIT_SECONDS,
            after_seq=result.task.last_seq if follow_up else None,
        )

    def render():
        task = Task.objects.get(pk=task_id)
        if task.answered_with_message and task.status_message:
            return {"message": task.status_message}
        return {"task": snapshot(task, history_length=history_length)}

    return await orm(render)


async def wait_until_settled(
    task_id: object, max_wait: float, *, after_seq: int | None = None
) -> None:
    """Wait on the hub until the task is terminal or interrupted, or `max_wait` passes.

    With `after_seq` only a status reached after that event counts (a message continuing an
    interrupted task is answered by the state the agent reaches next, not the one it found).
    """
    deadline = time.monotonic() + max_wait
    hub = get_hub()

    def state_and_seq():
        row = Task.objects.filter(pk=task_id).values_list("state", "last_seq").first()
        if row is None or after_seq is None or TaskState(row[0]) not in SETTLED_STATES:
            return row, True
        moved = TaskEvent.objects.filter(
            task_id=task_id, kind=EventKind.STATUS, seq__gt=after_seq
        ).exists()
        return row, moved

    while True:
        row, moved = await run_orm(state_and_seq)
        if row is None or (moved and TaskState(row[0]) in SETTLED_STATES):
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        await hub.wait_for_task_event(task_id, row[1], remaining)


async def send_streaming_message(ctx: Ctx, params: Params, *, resume_after: int | None = None):
    """A TaskStream (protocol/streams.py); the bindings frame it as SSE."""
    from a2a_platform.protocol import streams

    return await streams.send_streaming_message(ctx, params, resume_after=resume_after)


async def subscribe_to_task(ctx: Ctx, params: Params, *, resume_after: int | None = None):
    """A TaskStream (protocol/streams.py); the bindings frame it as SSE."""
    from a2a_platform.protocol import streams

    return await streams.subscribe_to_task(ctx, params, resume_after=resume_after)


# --- Tasks ---------------------------------------------------------------------------------


async def get_task(ctx: Ctx, params: Params) -> dict:
    req = parse_request(params, a2a_pb2.GetTaskRequest)
    if not req.id:
        raise invalid_params("id", "is required")
    history_length = _history_length(req)
    return await orm(lambda: snapshot(_visible_task(ctx, req.id), history_length=history_length))


async def cancel_task(ctx: Ctx, params: Params) -> dict:
    req = parse_request(params, a2a_pb2.CancelTaskRequest)
    if not req.id:
        raise invalid_params("id", "is required")

    def cancel():
        task = _visible_task(ctx, req.id)
        services.task_cancel(task_id=task.pk)
        return snapshot(Task.objects.get(pk=task.pk), history_length=None)

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
    from django.db.models import Q

    req = parse_request(params, a2a_pb2.ListTasksRequest)
    page_size = req.page_size if req.HasField("page_size") else 50
    if not 1 <= page_size <= 100:
        raise invalid_params("pageSize", "must be between 1 and 100")
    history_length = _history_length(req)
    include_artifacts = req.include_artifacts if req.HasField("include_artifacts") else False
    if ctx.principal == ANONYMOUS and not req.context_id:
        raise invalid_params(
            "contextId", "anonymous callers list only the tasks of a contextId they name"
        )
    cursor = _decode_cursor(req.page_token) if req.page_token else None
    after = None
    if req.HasField("status_timestamp_after"):
        after = req.status_timestamp_after.ToDatetime(tzinfo=UTC)

    def query():
        qs = Task.objects.filter(agent=ctx.agent, owner=ctx.principal)
        if req.context_id:
            qs = qs.filter(context_id=req.context_id)
        if req.status != a2a_pb2.TASK_STATE_UNSPECIFIED:
            qs = qs.filter(state=a2a_pb2.TaskState.Name(req.status))
        if after is not None:
            qs = qs.filter(status_timestamp__gte=after)
        total = qs.count()
        if cursor is not None:
            ts, pk = cursor
            qs = qs.filter(Q(status_timestamp__lt=ts) | Q(status_timestamp=ts, pk__lt=pk))
        rows = list(qs.order_by("-status_timestamp", "-pk")[: page_size + 1])
        more = len(rows) > page_size
        rows = rows[:page_size]
        return {
            "tasks": [
                snapshot(t, history_length=history_length, include_artifacts=include_artifacts)
                for t in rows
            ],
            "nextPageToken": _encode_cursor(rows[-1]) if more else "",
            "pageSize": page_size,
            "totalSize": total,
        }

    return await orm(query)


# --- Push configs ---------------------------------------------------------------------------


def _card_url(ctx: Ctx) -> str:
    from agents.card import agent_base_url

    return agent_base_url(ctx.agent, ctx.origin, at_root=ctx.at_root)


_card_versions: TTLCache[tuple[int | None]] = TTLCache(lambda: 5)


def _card_version_id(agent) -> int | None:
    """The card version a new task records (the agent's last served card; cached 5 s)."""
    from agents.cards import current_card_version_id

    cached = _card_versions.get(agent.pk)
    if cached is None:  # a miss; a cached "no version yet" is (None,)
        cached = _card_versions.put(agent.pk, (current_card_version_id(agent),))
    return cached[0]


def card_version_served(agent_pk: int, version_id: int) -> None:
    """The card endpoint served this version just now: tasks this process opens next record
    it (not the one cached before a capability flip)."""
    _card_versions.put(agent_pk, (version_id,))


async def readiness_now():
    """This instance's readiness (cached ≤ A2A_READINESS_CACHE_SECONDS; a cache miss costs one
    short ORM call)."""
    from agents import readiness

    return readiness.cached_or_none() or await run_orm(readiness.current)


async def _require_push(ctx: Ctx, *, registering: bool = True) -> None:
    """Push registrations are accepted only when they will be delivered: refused for good if
    the operator switched push off, refused with a retry hint while no delivery worker is
    live (never accepted and dropped). Reading or deleting a config (`registering=False`)
    promises no delivery: it is not refused while the delivery worker is away."""
    if not ctx.agent.push_notifications_enabled:
        raise ProtocolError(PUSH_NOT_SUPPORTED, "this agent does not offer push notifications")
    if registering and not (await readiness_now()).delivery_live:
        raise ProtocolError(
            UNAVAILABLE,
            "no webhook delivery worker is live right now; retry shortly",
            reason="PUSH_DELIVERY_UNAVAILABLE",
            retry_after=5,
        )


def _config_params(params: Params) -> Params:
    return {k: v for k, v in params.items() if k not in ("tenant", "taskId")}


async def _checked_push_config(params: Params):
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


async def create_push_config(ctx: Ctx, params: Params) -> dict:
    from webhooks.services import push_config_create, push_config_json

    await _require_push(ctx)
    req = parse_request(params, a2a_pb2.TaskPushNotificationConfig)
    if not req.task_id:
        raise invalid_params("taskId", "is required")
    checked = await _checked_push_config(params)
    issuer = _card_url(ctx)

    def write():
        task = _visible_task(ctx, req.task_id)
        binding = push_config_create(task=task, config=checked, issuer=issuer)
        return push_config_json(binding)

    return await orm(write)


def _task_and_config_id(params: Params, proto_cls: type) -> tuple[str, str]:
    req = parse_request(params, proto_cls)
    if not req.task_id:
        raise invalid_params("taskId", "is required")
    return req.task_id, getattr(req, "id", "")


async def get_push_config(ctx: Ctx, params: Params) -> dict:
    from webhooks.services import current_binding, push_config_json

    await _require_push(ctx, registering=False)
    task_id, config_id = _task_and_config_id(params, a2a_pb2.GetTaskPushNotificationConfigRequest)
    if not config_id:
        raise invalid_params("id", "is required")
    return await orm(
        lambda: push_config_json(current_binding(_visible_task(ctx, task_id), config_id))
    )


async def list_push_configs(ctx: Ctx, params: Params) -> dict:
    from webhooks.services import current_bindings, push_config_json

    await _require_push(ctx, registering=False)
    task_id, _ = _task_and_config_id(params, a2a_pb2.ListTaskPushNotificationConfigsRequest)

    def read():
        bindings = current_bindings(_visible_task(ctx, task_id))
        return {"configs": [push_config_json(b) for b in bindings], "nextPageToken": ""}

    return await orm(read)


async def delete_push_config(ctx: Ctx, params: Params) -> dict:
    from webhooks.services import push_config_delete

    await _require_push(ctx, registering=False)
    task_id, config_id = _task_and_config_id(
        params, a2a_pb2.DeleteTaskPushNotificationConfigRequest
    )
    if not config_id:
        raise invalid_params("id", "is required")
    await orm(lambda: push_config_delete(task=_visible_task(ctx, task_id), config_id=config_id))
    return {}


# --- Cards ---------------------------------------------------------------------------------


def capabilities(ctx: Ctx, readiness) -> dict[str, bool]:
    """What this instance can honour for this agent right now (computed per request)."""
    return {
        "pushNotifications": ctx.agent.push_notifications_enabled and readiness.delivery_live,
        # Streams ride this process's event hub (read in the event loop that runs it).
        "streaming": ctx.agent.streaming_enabled and get_hub().connected,
    }


def public_card(ctx: Ctx, caps: dict[str, bool] | None = None) -> dict:
    return render_card(ctx.agent, origin=ctx.origin, at_root=ctx.at_root, capabilities=caps)


async def get_extended_agent_card(ctx: Ctx, params: Params) -> dict:
    if not public_card(ctx)["capabilities"].get("extendedAgentCard"):
        raise ProtocolError(UNSUPPORTED_OPERATION, "this agent has no extended agent card")
    if not ctx.authenticated:
        raise ProtocolError(UNAUTHENTICATED, "the extended agent card needs an API key")
    return public_card(ctx, capabilities(ctx, await readiness_now()))


OPERATIONS = {
    "SendMessage": send_message,
    "SendStreamingMessage": send_streaming_message,
    "GetTask": get_task,
    "ListTasks": list_tasks,
    "CancelTask": cancel_task,
    "SubscribeToTask": subscribe_to_task,
    "CreateTaskPushNotificationConfig": create_push_config,
    "GetTaskPushNotificationConfig": get_push_config,
    "ListTaskPushNotificationConfigs": list_push_configs,
    "DeleteTaskPushNotificationConfig": delete_push_config,
    "GetExtendedAgentCard": get_extended_agent_card,
}
STREAMING_OPERATIONS = frozenset({"SendStreamingMessage", "SubscribeToTask"})
