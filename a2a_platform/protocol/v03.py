"""v0.3 compatibility: legacy method names and shapes in, v0.3 shapes out.

Requests are validated with the SDK's v0.3 models and translated to v1.0 with the SDK's
conversions; the same v1.0 operations run; results are translated back. JSON-RPC speaks the
v0.3 JSON types (`kind` discriminators, kebab-case states, bare results); HTTP+JSON speaks
ProtoJSON of the v0.3 proto (`a2a.v1`: `content` parts, `TASK_STATE_*`, `{"task"|"message"}`
wrapper), as the reference SDKs' v0.3 REST clients and servers do. v0.3 has no ListTasks.
"""

from __future__ import annotations

import copy
from typing import Any

from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb03
from a2a.compat.v0_3 import conversions, proto_utils
from a2a.compat.v0_3 import types as t03
from a2a.types import a2a_pb2
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP
from google.protobuf import json_format
from pydantic import ValidationError

from a2a_platform.protocol import operations, routes
from a2a_platform.protocol.context import Ctx
from a2a_platform.protocol.errors import (
    DOMAIN,
    METHOD_NOT_FOUND,
    TASK_NOT_FOUND,
    ProtocolError,
    invalid_params,
)

METHODS = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/resubscribe": "SubscribeToTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/get": "GetTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/list": "ListTaskPushNotificationConfigs",
    "tasks/pushNotificationConfig/delete": "DeleteTaskPushNotificationConfig",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}
_METHOD_OF = {v: k for k, v in METHODS.items()}

_REQUEST_MODELS = {
    "SendMessage": t03.SendMessageRequest,
    "SendStreamingMessage": t03.SendStreamingMessageRequest,
    "GetTask": t03.GetTaskRequest,
    "CancelTask": t03.CancelTaskRequest,
}


# Push-config operations: the v0.3 request model and the SDK conversion to the v1.0 request.
_PUSH_OPS = {
    "CreateTaskPushNotificationConfig": (
        t03.SetTaskPushNotificationConfigRequest,
        conversions.to_core_create_task_push_notification_config_request,
    ),
    "GetTaskPushNotificationConfig": (
        t03.GetTaskPushNotificationConfigRequest,
        conversions.to_core_get_task_push_notification_config_request,
    ),
    "ListTaskPushNotificationConfigs": (
        t03.ListTaskPushNotificationConfigRequest,
        conversions.to_core_list_task_push_notification_config_request,
    ),
    "DeleteTaskPushNotificationConfig": (
        t03.DeleteTaskPushNotificationConfigRequest,
        conversions.to_core_delete_task_push_notification_config_request,
    ),
}


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _legacy_request(op: str, params: dict[str, Any]) -> Any:
    model = _PUSH_OPS[op][0] if op in _PUSH_OPS else _REQUEST_MODELS[op]
    try:
        return model.model_validate(
            {"jsonrpc": "2.0", "id": 0, "method": _METHOD_OF[op], "params": params}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        # Drop `params` and the union member names pydantic puts in the path (`TaskIdParams`).
        where = ".".join(str(p) for p in first["loc"] if p != "params" and not str(p)[:1].isupper())
        raise invalid_params(where or "params", first["msg"]) from None


def _to_v1_params(op: str, params: dict[str, Any], rest: bool) -> dict[str, Any]:
    if op == "GetTask" and rest:
        params = {
            "id": params.get("id"),
            **({"historyLength": params["historyLength"]} if "historyLength" in params else {}),
        }
    legacy = _legacy_request(op, params)
    if op in ("SendMessage", "SendStreamingMessage"):
        core = conversions.to_core_send_message_request(legacy)
    elif op == "GetTask":
        core = conversions.to_core_get_task_request(legacy)
    else:
        core = conversions.to_core_cancel_task_request(legacy)
    return json_format.MessageToDict(core)


def _rest_send_params(params: dict[str, Any]) -> dict[str, Any]:
    """A v0.3 HTTP+JSON SendMessage body (ProtoJSON of the v0.3 `SendMessageRequest`:
    `message` or `request`, parts under `content`) as JSON-RPC `MessageSendParams`."""
    body = {k: v for k, v in params.items() if k != "tenant"}
    try:
        proto = json_format.ParseDict(body, pb03.SendMessageRequest(), ignore_unknown_fields=True)
        legacy = proto_utils.FromProto.message_send_params(proto)
    except json_format.ParseError as exc:
        raise invalid_params("body", str(exc).splitlines()[0][:300]) from None
    except (ValueError, TypeError) as exc:
        raise invalid_params("body", f"invalid value: {exc}"[:300]) from None
    return _dump(legacy)


def _task_v03(task: dict[str, Any]) -> t03.Task:
    proto = json_format.ParseDict(task, a2a_pb2.Task())
    return conversions.to_compat_task(proto)


def _message_v03(message: dict[str, Any]) -> t03.Message:
    proto = json_format.ParseDict(message, a2a_pb2.Message())
    return conversions.to_compat_message(proto)


def _rest_json(proto: Any) -> dict[str, Any]:
    return json_format.MessageToDict(proto)


def _rest_send_params(body: dict[str, Any]) -> dict[str, Any]:
    """The v0.3 REST binding speaks the v0.3 gRPC messages as JSON (`{"message": ...}`)."""
    try:
        req = json_format.ParseDict(body, pb03.SendMessageRequest(), ignore_unknown_fields=True)
        return _dump(proto_utils.FromProto.message_send_params(req))
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise invalid_params("message", str(exc).splitlines()[0][:300]) from None


def _rest_push_params(op: str, params: dict[str, Any]) -> dict[str, Any]:
    """A v0.3 HTTP+JSON push-config request (ids from the path; for create, a body that is
    the v0.3 `CreateTaskPushNotificationConfigRequest` as JSON) as JSON-RPC v0.3 params."""
    task_id = params.get("taskId", "")
    if op == "ListTaskPushNotificationConfigs":
        return {"id": task_id}
    if op != "CreateTaskPushNotificationConfig":
        return {"id": task_id, "pushNotificationConfigId": params.get("id", "")}
    body = {k: v for k, v in params.items() if k not in ("taskId", "tenant")}
    try:
        req = json_format.ParseDict(
            body, pb03.CreateTaskPushNotificationConfigRequest(), ignore_unknown_fields=True
        )
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise invalid_params("config", str(exc).splitlines()[0][:300]) from None
    config = _dump(
        proto_utils.FromProto.push_notification_config(req.config.push_notification_config)
    )
    if req.config_id and not config.get("id"):
        config["id"] = req.config_id
    return {"taskId": task_id, "pushNotificationConfig": config}


def _push_config_v03(config: dict[str, Any]) -> t03.TaskPushNotificationConfig:
    proto = json_format.ParseDict(config, a2a_pb2.TaskPushNotificationConfig())
    return conversions.to_compat_task_push_notification_config(proto)


async def _push_call(ctx: Ctx, op: str, params: dict[str, Any], *, rest: bool) -> Any:
    """tasks/pushNotificationConfig/set|get|list|delete: v0.3 params validated with the SDK's
    v0.3 models, translated with its conversions, run by the v1.0 operation, answered in v0.3
    shapes (JSON-RPC: the v0.3 JSON types, `null` for delete; REST: v0.3 ProtoJSON)."""
    core = json_format.MessageToDict(_PUSH_OPS[op][1](_legacy_request(op, params)))
    if op == "GetTaskPushNotificationConfig" and not core.get("id"):
        # v0.3 made `pushNotificationConfigId` optional: the task's first config answers.
        listed = await operations.list_push_configs(ctx, {"taskId": core.get("taskId", "")})
        if not listed["configs"]:
            raise ProtocolError(TASK_NOT_FOUND, metadata={"taskId": core.get("taskId", "")[:100]})
        result = listed["configs"][0]
    else:
        result = await routes.METHODS[op](ctx, core)
    if op == "DeleteTaskPushNotificationConfig":
        return {} if rest else None
    if op == "ListTaskPushNotificationConfigs":
        configs = [_push_config_v03(c) for c in result["configs"]]
        if rest:
            proto = pb03.ListTaskPushNotificationConfigResponse(
                configs=[proto_utils.ToProto.task_push_notification_config(c) for c in configs]
            )
            return _rest_json(proto)
        return [_dump(c) for c in configs]
    config = _push_config_v03(result)
    if rest:
        return _rest_json(proto_utils.ToProto.task_push_notification_config(config))
    return _dump(config)


def _rest_result(op: str, result: dict[str, Any]) -> dict[str, Any]:
    if op == "SendMessage" and result.get("kind") == "message":
        proto = proto_utils.ToProto.message(t03.Message.model_validate(result))
        return {"message": json_format.MessageToDict(proto)}
    task = json_format.MessageToDict(proto_utils.ToProto.task(t03.Task.model_validate(result)))
    return {"task": task} if op == "SendMessage" else task


async def call(ctx: Ctx, op: str, params: dict[str, Any], *, rest: bool = False) -> Any:
    if op in _PUSH_OPS:
        return await _push_call(
            ctx, op, _rest_push_params(op, params) if rest else params, rest=rest
        )
    if rest and op in ("SendMessage", "GetTask", "CancelTask"):
        if op == "SendMessage":
            params = _rest_send_params(params)
        return _rest_result(op, await call(ctx, op, params))
    if op == "ListTasks":
        raise ProtocolError(METHOD_NOT_FOUND, "v0.3 has no ListTasks; use A2A-Version 1.0")
    handler = routes.METHODS[op]
    if op in _REQUEST_MODELS:
        if rest and op in ("SendMessage", "SendStreamingMessage"):
            params = _rest_send_params(params)
        result = await handler(ctx, _to_v1_params(op, params, rest))
    elif op == "GetExtendedAgentCard":
        card_v1 = await handler(ctx, {})
        if rest:
            legacy_card = conversions.to_compat_agent_card(
                json_format.ParseDict(card_v1, a2a_pb2.AgentCard())
            )
            return _rest_json(proto_utils.ToProto.agent_card(legacy_card))
        return card(card_v1)
    else:
        # Not reached by the streaming operations: binding.open_stream opens them.
        result = await handler(ctx, params)
    if op == "SendMessage":
        legacy = _task_v03(result["task"]) if "task" in result else _message_v03(result["message"])
        return _rest_json(proto_utils.ToProto.task_or_message(legacy)) if rest else _dump(legacy)
    task = _task_v03(result)
    return _rest_json(proto_utils.ToProto.task(task)) if rest else _dump(task)


def card(card_v1: dict[str, Any]) -> dict[str, Any]:
    """The v1.0 card with the v0.3 fields merged in (v1.0 values win), so a v0.3 client finds
    `url`, `preferredTransport`, `protocolVersion` where it looks. Merged deeply, as a2a-sdk
    does: a key both versions use with different shapes (`securitySchemes.<name>`) carries
    both, so neither reader loses it."""
    proto = json_format.ParseDict(card_v1, a2a_pb2.AgentCard())
    legacy = _dump(conversions.to_compat_agent_card(proto))
    return _fill(copy.deepcopy(card_v1), legacy)


def _fill(target: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Add the keys of `extra` missing from `target`, recursing into objects and into the
    objects of lists at the same index."""
    for key, value in extra.items():
        if key not in target:
            target[key] = value
        elif isinstance(value, dict) and isinstance(target[key], dict):
            _fill(target[key], value)
        elif isinstance(value, list) and isinstance(target[key], list):
            for mine, theirs in zip(target[key], value, strict=False):
                if isinstance(mine, dict) and isinstance(theirs, dict):
                    _fill(mine, theirs)
    return target


def jsonrpc_error(error: ProtocolError) -> dict[str, Any]:
    data: dict[str, Any] = {"reason": error.reason or error.kind.reason, **error.metadata}
    if error.violations:
        data["fieldViolations"] = [{"field": f, "description": d} for f, d in error.violations]
    return {"code": error.kind.jsonrpc_code, "message": error.message, "data": data}


# The SDK error class a v0.3 REST error body names in `type` (a2a-sdk's v0.3 REST client
# raises that class; without it every error is a bare A2AClientError, a 404 a MethodNotFound).
_ERROR_TYPE = {code: cls.__name__ for cls, code in JSON_RPC_ERROR_CODE_MAP.items()}


def rest_error(error: ProtocolError) -> dict[str, Any]:
    body = {
        "code": error.kind.jsonrpc_code,
        "message": error.message,
        "data": jsonrpc_error(error)["data"],
    }
    if error.kind.domain == DOMAIN and error.kind.jsonrpc_code in _ERROR_TYPE:
        body["type"] = _ERROR_TYPE[error.kind.jsonrpc_code]
    return body


# --- Streams ---------------------------------------------------------------------------------


async def open_stream(
    ctx: Ctx, op: str, params: dict[str, Any], *, rest: bool, resume_after: int | None
) -> Any:
    """`message/stream` and `tasks/resubscribe` (and their REST routes): v0.3 params in, the
    v1.0 TaskStream out; render its events with `stream_event`."""
    if op == "SendStreamingMessage":
        if rest:
            params = _rest_send_params(params)
        v1_params = _to_v1_params(op, params, rest)
    else:
        task_id = params.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise invalid_params("id", "is required")
        v1_params = {"id": task_id}
    return await routes.METHODS[op](ctx, v1_params, resume_after=resume_after)


def stream_event(response: dict[str, Any], *, last: bool, rest: bool) -> dict[str, Any]:
    """A v1.0 StreamResponse as a v0.3 stream event: the JSON-RPC `result` (with `kind`) or
    the v0.3 REST StreamResponse. `final: true` marks the status update that ends the stream
    (terminal or interrupted; the SDK's conversion sets it for terminal states only)."""
    proto = json_format.ParseDict(response, a2a_pb2.StreamResponse())
    legacy = conversions.to_compat_stream_response(proto).result
    if isinstance(legacy, t03.TaskStatusUpdateEvent):
        legacy = legacy.model_copy(update={"final": last})
    return _rest_json(proto_utils.ToProto.stream_response(legacy)) if rest else _dump(legacy)
