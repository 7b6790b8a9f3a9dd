"""`Idempotency-Key` on creating POSTs (views with `idempotent = True`).

The key is claimed (a unique row per principal and key, committed) after authentication and
permission checks and before the view runs; the view's answer below 500 is kept with it for
24 hours. A retry with the same key and the same request (method, path, body) gets that answer
again and runs nothing; the same key with another request is 422 `idempotency_key_reused`; a
duplicate arriving while the first still runs is 409 `idempotency_in_progress` (retry). A 5xx
or a crash mid-request releases the claim, so the retry runs.

A secret is shown once, never kept: an answer's `secret` (a new token's or API key's) is not
stored with the claim, so its replay is the first answer with `"secret": null` — the key or
token was made, its id is there to revoke it, and only its digest exists anywhere."""

from __future__ import annotations

import hashlib
import json

from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from a2a_platform.api import services
from a2a_platform.api.auth import principal
from a2a_platform.api.errors import IdempotencyInProgress, IdempotencyKeyReused, invalid

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
# Fields of an answer never kept for its replay (a replay answers them null).
SECRET_FIELDS = ("secret",)


class Replay(Exception):
    """The stored first answer of a retried key (raised to skip the view)."""

    def __init__(self, status_code: int, body: object) -> None:
        self.status_code = status_code
        self.body = body


def fingerprint(request) -> str:
    body = json.dumps(request.data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


def claim(request) -> services.Claim | None:
    """Claim the request's key (None without the header); raises Replay for a finished
    first request, IdempotencyKeyReused or IdempotencyInProgress."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable() or not key.isascii():
        raise invalid(HEADER, f"1 to {MAX_KEY_LENGTH} printable ASCII characters")
    mark = fingerprint(request)
    result = services.idempotency_claim(
        principal=principal(request),
        key=key,
        method=request.method,
        path=request.path[:500],
        fingerprint=mark,
    )
    if result.fresh:
        return result
    row = result.row
    if row.fingerprint != mark:
        raise IdempotencyKeyReused(
            f"this {HEADER} was used for another request ({row.method} {row.path}) "
            "in the last 24 hours"
        )
    if row.status_code is None:
        raise IdempotencyInProgress(
            f"the first request with this {HEADER} is still running; retry shortly",
            headers={"Retry-After": "1"},
            retryAfter=1,
        )
    raise Replay(row.status_code, row.response)


def finish(result: services.Claim, response: Response) -> None:
    """Keep the first answer (below 500) with its claim; release it otherwise."""
    if response.status_code >= 500:
        services.idempotency_release(claim_id=result.row.pk)
    else:
        # As the renderer would write it (UUIDs, times, decimals as JSON), so the replay is
        # byte for byte the first answer's content.
        body = json.loads(json.dumps(response.data, cls=JSONEncoder))
        if isinstance(body, dict):
            body = {k: (None if k in SECRET_FIELDS else v) for k, v in body.items()}
        services.idempotency_record(
            claim_id=result.row.pk, status_code=response.status_code, response=body
        )


def replay_response(replay: Replay) -> Response:
    response = Response(replay.body, status=replay.status_code)
    response["Idempotent-Replayed"] = "true"
    return response
