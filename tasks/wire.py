"""ProtoJSON shapes of the task store, built with the official a2a-sdk protobuf types.

`parse_*` normalise and validate incoming A2A objects (raising InvalidPayload); `*_json`
render stored rows. Every dict that leaves here is exact ProtoJSON of `lf.a2a.v1`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from datetime import UTC, datetime
from typing import Any

from a2a.types import a2a_pb2
from django.conf import settings
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from tasks.errors import InvalidPayload


def timestamp_json(value: datetime) -> str:
    """ISO 8601 UTC with millisecond precision and a `Z` (spec §5.6.1)."""
    return value.astimezone(UTC).isoformat(timespec="milliseconds").removesuffix("+00:00") + "Z"


def to_json(message: ProtoMessage) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=False)


def parse_dict(data: dict, proto_cls: type[ProtoMessage]) -> ProtoMessage:
    """ProtoJSON parsing that ignores unknown fields (spec §5.7) but not unknown enum values.

    protobuf's `ignore_unknown_fields` also silently drops unknown enum strings (a typo in a
    status filter would mean "no filter"), so parse strictly first and relax only when the
    strict error is about an unknown field. Raises ParseError, ValueError or TypeError.
    Flat requests (GetTask's id and historyLength) are built directly when they can be.
    """
    built = _built_directly(data, proto_cls)
    return built if built is not None else _parsed_by_protobuf(data, proto_cls)


def _parsed_by_protobuf(data: dict, proto_cls: type[ProtoMessage]) -> ProtoMessage:
    """`parse_dict` by protobuf's JSON parser alone: strict, and when the strict error is about
    an unknown field, strict again on the data without its unknown fields (at every depth), so
    an unknown enum value is refused wherever it stands among the keys."""
    try:
        try:
            return json_format.ParseDict(data, proto_cls())
        except json_format.ParseError as exc:
            if "has no field named" not in str(exc):
                raise
        return json_format.ParseDict(_known_fields(data, proto_cls.DESCRIPTOR), proto_cls())
    except (OverflowError, SystemError) as exc:
        # A number beyond a double (JSON's 1e400) and text protobuf cannot encode (a lone
        # surrogate, which its C parser reports as a SystemError): both invalid values.
        raise ValueError(f"{type(exc).__name__}: {exc}") from None


# Messages whose ProtoJSON form is free JSON (or names its own type): kept as they are.
_FREE_FORM = {
    "google.protobuf.Struct",
    "google.protobuf.Value",
    "google.protobuf.ListValue",
    "google.protobuf.Any",
}


def _known_fields(data: Any, descriptor) -> Any:
    """`data` less the keys that name no field of `descriptor`'s message, at every depth (spec
    §5.7: unknown fields are ignored); values are left for the strict parser to judge."""
    if not isinstance(data, dict) or descriptor.full_name in _FREE_FORM:
        return data
    fields = {f.json_name: f for f in descriptor.fields} | {f.name: f for f in descriptor.fields}
    known = {}
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            continue
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            entry = message.fields_by_name["value"].message_type
            if entry is not None and isinstance(value, dict):
                value = {k: _known_fields(v, entry) for k, v in value.items()}
        elif message is not None and isinstance(value, list):
            value = [_known_fields(item, message) for item in value]
        elif message is not None:
            value = _known_fields(value, message)
        known[key] = value
    return known


# The scalar fields a request can be built from directly: the JSON type each must have.
_DIRECT_TYPES = {
    FieldDescriptor.TYPE_STRING: str,
    FieldDescriptor.TYPE_INT32: int,
    FieldDescriptor.TYPE_BOOL: bool,
}


@functools.cache
def _direct_fields(proto_cls: type[ProtoMessage]) -> dict[str, tuple[str, type]]:
    """Each singular string, int32 or bool field of `proto_cls` by its JSON and its proto
    name: (proto name, the JSON type it takes). A field in a real oneof is left out (two of
    its members given is an error the parser words)."""
    fields = {}
    for field in proto_cls.DESCRIPTOR.fields:
        kind = _DIRECT_TYPES.get(field.type)
        oneof = field.containing_oneof
        if kind is None or field.is_repeated or (oneof is not None and len(oneof.fields) > 1):
            continue
        fields[field.json_name] = fields[field.name] = (field.name, kind)
    return fields


def _built_directly(data: dict, proto_cls: type[ProtoMessage]) -> ProtoMessage | None:
    """`data` as the message ParseDict would build, or None when it is not only known scalar
    fields of exactly their JSON type (ParseDict then parses it, and words its errors).
    protobuf's JSON parser costs about 10 µs for GetTask's two fields; this, under one."""
    fields = _direct_fields(proto_cls)
    values = {}
    for key, value in data.items():
        found = fields.get(key)
        if found is None or found[0] in values or type(value) is not found[1]:
            return None
        values[found[0]] = value
    try:
        return proto_cls(**values)
    except (ValueError, TypeError):  # out of range, text protobuf refuses: ParseDict words it
        return None


def parse_proto(data: Any, proto_cls: type[ProtoMessage], field: str) -> ProtoMessage:
    if not isinstance(data, dict):
        raise InvalidPayload(field, "must be a JSON object")
    try:
        return parse_dict(data, proto_cls)
    except json_format.ParseError as exc:
        text = str(exc).splitlines()[0]
        path = ".".join([field, *_FIELD_STEP.findall(text)])
        raise InvalidPayload(path, describe_parse_error(text)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidPayload(field, f"invalid value: {exc}"[:300]) from None


_FIELD_STEP = re.compile(r"Failed to parse (\w+) field: ")
_BAD_ENUM = re.compile(r"Invalid enum value (.+?) for enum type (?:[\w]+\.)*(\w+)")
_BAD_TYPE = re.compile(r"expected (string|bytes-like object|[\w ]+?)(?: or [\w -]+)?, got '(\w+)'")
_JSON_TYPES = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean"}
_JSON_TYPES |= {"list": "an array", "dict": "an object", "NoneType": "null"}


def describe_parse_error(text: str) -> str:
    """protobuf's parse error in words a client developer can act on: `Failed to parse role
    field: Invalid enum value user for enum type lf.a2a.v1.Role at Message.role.` becomes
    "'user' is not a Role: use one of ROLE_USER, ROLE_AGENT"."""
    detail = _FIELD_STEP.sub("", text).split(" at ", 1)[0].rstrip(".")
    enum = _BAD_ENUM.search(detail)
    if enum:
        value, name = enum.group(1), enum.group(2)
        known = a2a_pb2.DESCRIPTOR.enum_types_by_name.get(name)
        choices = [v.name for v in known.values if v.number] if known else []
        hint = f": use one of {', '.join(choices)}" if choices else ""
        return f"{value!r} is not a {name}{hint}"
    wrong = _BAD_TYPE.search(detail)
    if wrong:
        got = _JSON_TYPES.get(wrong.group(2), wrong.group(2))
        return f"must be a string, not {got}" if "string" in wrong.group(1) else detail
    if detail.startswith("repeated field "):
        return "must be an array"
    return detail.replace("lf.a2a.v1.", "")[:300]


MAX_ID_LENGTH = 255


def _check_raw_base64(data: Any, field: str) -> None:
    """protobuf's JSON parser decodes base64 leniently; A2A clients deserve a clear error."""
    parts = data.get("parts") if isinstance(data, dict) else None
    if not isinstance(parts, list):
        return
    for i, part in enumerate(parts):
        raw = part.get("raw") if isinstance(part, dict) else None
        if isinstance(raw, str):
            normalized = raw.strip().replace("-", "+").replace("_", "/")
            normalized += "=" * (-len(normalized) % 4)
            try:
                base64.b64decode(normalized, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidPayload(f"{field}.parts[{i}].raw", "is not valid base64") from None


def _check_lengths(field: str, **values: str) -> None:
    for name, value in values.items():
        if len(value) > MAX_ID_LENGTH:
            raise InvalidPayload(f"{field}.{name}", f"must be at most {MAX_ID_LENGTH} characters")


def _check_parts(parts: Any, field: str) -> None:
    if not parts:
        raise InvalidPayload(field, "at least one part is required")
    if len(parts) > settings.A2A_MAX_PARTS_PER_MESSAGE:
        raise InvalidPayload(
            field, f"at most {settings.A2A_MAX_PARTS_PER_MESSAGE} parts (A2A_MAX_PARTS_PER_MESSAGE)"
        )
    for i, part in enumerate(parts):
        if part.WhichOneof("content") is None:
            raise InvalidPayload(f"{field}[{i}]", "a part needs one of text, raw, url or data")
        if part.WhichOneof("content") == "url" and not part.url:
            raise InvalidPayload(f"{field}[{i}].url", "must not be empty")


def parse_message(data: Any, *, field: str = "message") -> a2a_pb2.Message:
    """Validate an A2A Message: messageId, a role and at least one part with content."""
    _check_raw_base64(data, field)
    return check_message(parse_proto(data, a2a_pb2.Message, field), field=field)


def check_message(msg: a2a_pb2.Message, *, field: str = "message") -> a2a_pb2.Message:
    """`parse_message`'s rules for a message already parsed (its base64 already decoded)."""
    _check_lengths(field, messageId=msg.message_id, contextId=msg.context_id, taskId=msg.task_id)
    if not msg.message_id:
        raise InvalidPayload(f"{field}.messageId", "is required")
    if msg.role == a2a_pb2.ROLE_UNSPECIFIED:
        raise InvalidPayload(f"{field}.role", "must be ROLE_USER or ROLE_AGENT")
    _check_parts(msg.parts, f"{field}.parts")
    return msg


def parse_artifact(data: Any, *, field: str = "artifact") -> a2a_pb2.Artifact:
    _check_raw_base64(data, field)
    art = parse_proto(data, a2a_pb2.Artifact, field)
    _check_lengths(field, artifactId=art.artifact_id, name=art.name)
    if not art.artifact_id:
        raise InvalidPayload(f"{field}.artifactId", "is required")
    _check_parts(art.parts, f"{field}.parts")
    return art


def message_text(message: a2a_pb2.Message | dict) -> str:
    """The concatenated text parts of a message (for executors)."""
    if isinstance(message, dict):
        return "\n".join(p["text"] for p in message.get("parts", []) if "text" in p)
    return "\n".join(p.text for p in message.parts if p.WhichOneof("content") == "text")


def stored_message_json(row: Any) -> dict[str, Any]:
    """A history row (tasks.models.Message) as an A2A Message."""
    out: dict[str, Any] = {
        "messageId": row.message_id,
        "contextId": row.task.context_id,
        "taskId": str(row.task_id),
        "role": row.role,
        "parts": row.parts,
    }
    if row.metadata:
        out["metadata"] = row.metadata
    if row.extensions:
        out["extensions"] = row.extensions
    if row.reference_task_ids:
        out["referenceTaskIds"] = row.reference_task_ids
    return out


def artifact_json(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"artifactId": row.artifact_id, "parts": row.parts}
    if row.name:
        out["name"] = row.name
    if row.description:
        out["description"] = row.description
    if row.metadata:
        out["metadata"] = row.metadata
    if row.extensions:
        out["extensions"] = row.extensions
    return out


def status_json(task: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"state": task.state, "timestamp": timestamp_json(task.status_timestamp)}
    if task.status_message:
        out["message"] = task.status_message
    return out


def task_json(
    task: Any,
    *,
    history: list[Any] | None = None,
    artifacts: list[Any] | None = None,
) -> dict[str, Any]:
    """A Task snapshot. `history`/`artifacts` are the rows to include (None = omit the key)."""
    out: dict[str, Any] = {
        "id": str(task.id),
        "contextId": task.context_id,
        "status": status_json(task),
    }
    if artifacts:
        out["artifacts"] = [artifact_json(a) for a in artifacts]
    if history:
        out["history"] = [stored_message_json(m) for m in history]
    if task.metadata:
        out["metadata"] = task.metadata
    return out


def status_update_json(task: Any) -> dict[str, Any]:
    return {
        "statusUpdate": {
            "taskId": str(task.id),
            "contextId": task.context_id,
            "status": status_json(task),
        }
    }


def artifact_update_json(
    task: Any, chunk: dict[str, Any], *, append: bool, last_chunk: bool
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "taskId": str(task.id),
        "contextId": task.context_id,
        "artifact": chunk,
    }
    if append:
        event["append"] = True
    if last_chunk:
        event["lastChunk"] = True
    return {"artifactUpdate": event}
