"""Request parsing shared by the operations (operations.py), the streams (streams.py) and the
write path (writes.py): a request's params as its protobuf message, errors naming the
offending field."""

from __future__ import annotations

import re
from typing import Any

from google.protobuf import json_format

from a2a_platform.protocol.errors import invalid_params
from tasks import wire

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
        raise invalid_params(_error_path(text), wire.describe_parse_error(text)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise invalid_params("params", f"invalid value: {exc}"[:300]) from None


def _error_path(parse_error: str) -> str:
    """`... at SendMessageRequest.message.role.` -> `message.role` (the offending field)."""
    _, sep, where = parse_error.rpartition(" at ")
    path = where.rstrip(".").split(".", 1)
    repeated = re.search(r"repeated field (\w+) must be", parse_error)
    if sep and len(path) == 2 and path[1]:
        # "repeated field parts must be in [] ... at X.message." names the field only there.
        return f"{path[1]}.{repeated.group(1)}" if repeated else path[1]
    chain = re.findall(r"Failed to parse (\w+) field", parse_error)
    return ".".join(chain) or "params"


def parse_history_length(req: Any, field: str = "history_length") -> int | None:
    if not req.HasField(field):
        return None
    value = getattr(req, field)
    if value < 0:
        raise invalid_params("historyLength", "must not be negative")
    return value
