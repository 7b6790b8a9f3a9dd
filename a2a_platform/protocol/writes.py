"""The one write path of SendMessage and SendStreamingMessage (`accept_message`): the
message checked against the agent's modes, the new task written (with the other sends of the
same turn of the event loop, `_new_tasks`) or the follow-up, its inline push config and its
idempotency receipt in one transaction, and the card version a new task records.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import json_format

from a2a_platform.lib import tracing
from a2a_platform.lib.orm import Coalesced
from a2a_platform.lib.ttl_cache import TTLCache
from a2a_platform.protocol.context import ANONYMOUS, Ctx
from a2a_platform.protocol.errors import (
    CONTENT_TYPE_NOT_SUPPORTED,
    ProtocolError,
    domain_errors,
    invalid_params,
    orm,
)
from a2a_platform.protocol.params import Params, parse_history_length, parse_request
from a2a_platform.protocol.push_gate import checked_push_config, require_push
from a2a_platform.protocol.visibility import snapshot, visible_task
from tasks import services, wire
from tasks.event_hub import get_hub


def _without_message(params: Any) -> Any:
    """SendMessage's params but its message (anything else as it is, for parse_request to
    refuse)."""
    if isinstance(params, dict) and "message" in params:
        return {key: value for key, value in params.items() if key != "message"}
    return params


def _media_match(accepted: str, offered: str) -> bool:
    a_type, _, a_sub = accepted.partition("/")
    o_type, _, o_sub = offered.partition("/")
    return a_type in ("*", o_type) and a_sub in ("*", o_sub, "")


def _check_output_modes(ctx: Ctx, accepted: list[str]) -> None:
    offered = ctx.agent.default_output_modes or ["text/plain"]
    # Either side may be a range: an agent offering */* (the demo echoes what it is sent)
    # produces whatever the client accepts.
    if accepted and not any(
        _media_match(a, o) or _media_match(o, a) for a in accepted for o in offered
    ):
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


@dataclass(frozen=True)
class Accepted:
    """A client message written by SendMessage or SendStreamingMessage."""

    result: services.SendResult
    history_length: int | None
    return_immediately: bool
    snapshot: dict | None = None  # the task as of this write, rendered in its transaction
    # With `wake_on_new`: the event hub's subscription to the new task, made before the
    # write (None when the send continued a task or was answered at once). The caller
    # unsubscribes it (`release_wake`).
    woken: asyncio.Future | None = None

    def release_wake(self) -> None:
        if self.woken is not None:
            get_hub().unsubscribe(self.result.task.pk, self.woken)


async def accept_message(
    ctx: Ctx, params: Params, *, render_snapshot: bool = False, wake_on_new: bool = False
) -> Accepted:
    """Validate and write a client message: the one write path of SendMessage and
    SendStreamingMessage (a new task or a follow-up, its inline push config and the
    idempotency receipt in one transaction). `render_snapshot`: also render the task exactly
    as of this write, inside the transaction (a stream's cursor starts there).
    `wake_on_new` (a blocking send): a new task's id is chosen here and subscribed to on the
    event hub before the write, so its first wake-up cannot be missed and the waiter needs no
    read until then (`Accepted.woken`)."""
    params = {} if params is None else params  # as parse_request takes it
    # The request without its message, which is parsed once, below, as the client sent it.
    req = parse_request(_without_message(params), a2a_pb2.SendMessageRequest)
    if params.get("message") is None:  # absent, or null (ProtoJSON's unset)
        raise invalid_params("message", "is required")
    config = req.configuration
    history_length = parse_history_length(config) if req.HasField("configuration") else None
    raw_push = None
    if config.HasField("task_push_notification_config"):
        await require_push(ctx)
        # The config as the client sent it, even `{}`: push_config_check then names what
        # is missing (a falsy `or` here dropped an empty config, and the task had no webhook).
        given = params["configuration"]
        key = "taskPushNotificationConfig"
        raw_push = given[key] if key in given else given["task_push_notification_config"]
    # Validate the message as the client sent it (base64, lengths, parts).
    msg = wire.parse_message(params["message"])
    if msg.role != a2a_pb2.ROLE_USER:
        raise invalid_params("message.role", "a client message must have role ROLE_USER")
    _check_output_modes(ctx, list(config.accepted_output_modes))
    _check_input_parts(ctx, msg)
    request_hash = _request_hash(params) if ctx.principal != ANONYMOUS else None
    metadata = json_format.MessageToDict(req.metadata) if req.HasField("metadata") else None
    if raw_push is not None and msg.task_id:
        # The task before the URL: a foreign or unknown task is TaskNotFound whatever the URL.
        await orm(lambda: visible_task(ctx, msg.task_id))
    inline_push = None if raw_push is None else await checked_push_config(raw_push)
    issuer = card_url(ctx)
    # A new task continues the request's trace (app.handle made the caller's current), or
    # starts one: read here, on the request's context, not on an ORM thread.
    trace = ("", "") if msg.task_id else tracing.new_task_trace()
    new_task_id = woken = None
    if wake_on_new and not config.return_immediately and not msg.task_id:
        new_task_id = uuid.uuid4()
        hub = get_hub()
        # Not waiting for the hub to be connected (a database outage must refuse the write
        # at once): a wake-up it misses while disconnected is covered by the wake-up of every
        # waiter it sends when it connects.
        await hub.start(timeout=0)
        woken = hub.subscribe(new_task_id)

    def write() -> Accepted:
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
            new_task_id=new_task_id,
            trace=trace,
        )
        return Accepted(result, history_length, config.return_immediately, written)

    try:
        if inline_push is None and not msg.task_id:
            # A new task with nothing written beside it: written with the other sends of
            # this turn of the event loop, in one statement (`_new_tasks`).
            send = services.NewSend(
                ctx.agent,
                ctx.principal,
                msg,
                request_hash,
                metadata,
                task_pk=new_task_id,
                trace=trace,
            )
            result = await domain_errors(_new_tasks(send))
            # A created task's snapshot is in hand (no query); a replay has none, as below.
            written = None
            if render_snapshot and result.created:
                written = _written_snapshot(result, history_length)
            accepted = Accepted(result, history_length, config.return_immediately, written)
        else:
            accepted = await orm(write)
    except BaseException:
        if woken is not None:
            get_hub().unsubscribe(new_task_id, woken)
        raise
    if woken is None:
        return accepted
    if accepted.result.task.pk != new_task_id:  # a replay: answered with the earlier task
        get_hub().unsubscribe(new_task_id, woken)
        return accepted
    return dataclasses.replace(accepted, woken=woken)


def _written_snapshot(result: services.SendResult, history_length: int | None) -> dict:
    if result.first_message is not None:
        # A task created by this very write: everything to render is in hand (no queries).
        history = [result.first_message] if history_length != 0 else None
        return wire.task_json(result.task, history=history)
    return snapshot(result.task, history_length=history_length)


# --- Card versions -------------------------------------------------------------------------


def card_url(ctx: Ctx) -> str:
    from agents.card_render import agent_base_url

    return agent_base_url(ctx.agent, ctx.origin, at_root=ctx.at_root)


_card_versions: TTLCache[tuple[int | None]] = TTLCache(lambda: 5)


def _card_version_id(agent) -> int | None:
    """The card version a new task records (the agent's last served card; cached 5 s)."""
    from agents.card_signing import current_card_version_id

    cached = _card_versions.get(agent.pk)
    if cached is None:  # a miss; a cached "no version yet" is (None,)
        cached = _card_versions.put(agent.pk, (current_card_version_id(agent),))
    return cached[0]


def _open_new(sends: list[services.NewSend]) -> list[services.SendResult | Exception]:
    """On an ORM thread: the new tasks of one turn's sends, each with its agent's card
    version."""
    return services.task_send_new(
        sends=[dataclasses.replace(s, card_version_id=_card_version_id(s.agent)) for s in sends]
    )


# The sends of one turn that open a task alone: one statement and one commit for all of them
# (services.task_send_new; docs/decisions.md, "Coalesced reads and writes").
_new_tasks = Coalesced(_open_new)


def card_version_served(agent_pk: int, version_id: int) -> None:
    """The card endpoint served this version just now: tasks this process opens next record
    it (not the one cached before a capability flip)."""
    _card_versions.put(agent_pk, (version_id,))
