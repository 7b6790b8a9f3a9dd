"""v0.3 compatibility: legacy method names and shapes in, v0.3 shapes out.

Requests are validated with the SDK's v0.3 models and translated to v1.0 with the SDK's
conversions; the same v1.0 operations run; results are translated back (`kind`
discriminators, kebab-case states, bare results). v0.3 has no ListTasks.
"""

from __future__ import annotations

from typing import Any

from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as t03
from a2a.types import a2a_pb2
from google.protobuf import json_format
from pydantic import ValidationError

from a2a_platform.protocol import operations
from a2a_platform.protocol.context import Ctx
from a2a_platform.protocol.errors import METHOD_NOT_FOUND, ProtocolError, invalid_params

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


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _legacy_request(op: str, params: dict[str, Any]) -> Any:
    model = _REQUEST_MODELS[op]
    try:
        return model.model_validate(
            {"jsonrpc": "2.0", "id": 0, "method": _METHOD_OF[op], "params": params}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p not in ("params",))
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


def _task_v03(task: dict[str, Any]) -> dict[str, Any]:
    proto = json_format.ParseDict(task, a2a_pb2.Task())
    return _dump(conversions.to_compat_task(proto))


def _message_v03(message: dict[str, Any]) -> dict[str, Any]:
    proto = json_format.ParseDict(message, a2a_pb2.Message())
    return _dump(conversions.to_compat_message(proto))


async def call(ctx: Ctx, op: str, params: dict[str, Any], *, rest: bool = False) -> Any:
    if op == "ListTasks":
        raise ProtocolError(METHOD_NOT_FOUND, "v0.3 has no ListTasks; use A2A-Version 1.0")
    handler = operations.OPERATIONS[op]
    if op in _REQUEST_MODELS:
        result = await handler(ctx, _to_v1_params(op, params, rest))
    elif op == "GetExtendedAgentCard":
        return card(await handler(ctx, {}))
    else:
        # Streaming and push-config operations answer their v1.0 refusals for now.
        result = await handler(ctx, params)
    if op == "SendMessage":
        return _task_v03(result["task"]) if "task" in result else _message_v03(result["message"])
    return _task_v03(result)


def card(card_v1: dict[str, Any]) -> dict[str, Any]:
    """The v1.0 card with the v0.3 top-level fields merged in (v1.0 keys win), so a v0.3
    client finds `url`, `preferredTransport`, `protocolVersion` where it looks."""
    proto = json_format.ParseDict(card_v1, a2a_pb2.AgentCard())
    legacy = _dump(conversions.to_compat_agent_card(proto))
    return {**legacy, **card_v1}


def jsonrpc_error(error: ProtocolError) -> dict[str, Any]:
    data: dict[str, Any] = {"reason": error.reason or error.kind.reason, **error.metadata}
    if error.violations:
        data["fieldViolations"] = [{"field": f, "description": d} for f, d in error.violations]
    return {"code": error.kind.jsonrpc_code, "message": error.message, "data": data}


def rest_error(error: ProtocolError) -> dict[str, Any]:
    return {
        "code": error.kind.jsonrpc_code,
        "message": error.message,
        "data": jsonrpc_error(error)["data"],
    }
