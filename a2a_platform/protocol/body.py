"""Reading and checking request bodies before anything else sees them."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from starlette.requests import Request

from a2a_platform.protocol.errors import PARSE_ERROR, PAYLOAD_TOO_LARGE, ProtocolError


async def read_body(request: Request) -> bytes:
    """The body, refused from Content-Length when too large (before reading), and while
    reading when it is chunked."""
    limit = settings.A2A_MAX_BODY_BYTES
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise ProtocolError(PARSE_ERROR, "invalid Content-Length")
        if int(declared) > limit:
            raise ProtocolError(
                PAYLOAD_TOO_LARGE, f"request body exceeds {limit} bytes", metadata={"limit": limit}
            )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(
                PAYLOAD_TOO_LARGE, f"request body exceeds {limit} bytes", metadata={"limit": limit}
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def check_json(value: Any) -> None:
    """Refuse what JSON parsers accept but the store cannot keep or walk safely: nesting
    deeper than A2A_MAX_JSON_DEPTH and NUL characters (PostgreSQL's jsonb rejects them)."""
    max_depth = settings.A2A_MAX_JSON_DEPTH
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > max_depth:
                raise ProtocolError(PARSE_ERROR, f"JSON nested deeper than {max_depth} levels")
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(key, str) and "\x00" in key:
                    raise ProtocolError(PARSE_ERROR, "NUL characters are not accepted")
                stack.append((child, depth + 1))
        elif isinstance(item, str) and "\x00" in item:
            raise ProtocolError(PARSE_ERROR, "NUL characters are not accepted")


def parse_json(body: bytes) -> Any:
    if not body.strip():
        raise ProtocolError(PARSE_ERROR, "empty request body")
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(PARSE_ERROR, f"invalid JSON: {str(exc)[:200]}") from None
    check_json(value)
    return value
