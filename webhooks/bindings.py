"""Push binding versions: checking a config (`push_config_check`), making a version, and the
delivery bodies written beside it; the pieces the registration (webhooks/services.py) and a
rebind (webhooks/rebinds/operations.py, webhooks/rebinds/channel_moves.py) share. The writes run
inside the caller's transaction and validate nothing (callers check first)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from a2a.types import a2a_pb2

from a2a_platform.lib.crypto import encrypt
from tasks import wire
from tasks.errors import InvalidPayload
from tasks.models import Task
from webhooks.delivery.ssrf import UnsafeDestination, check_url_at_registration
from webhooks.models import (
    CONFIG_ID,
    Delivery,
    DeliveryKind,
    DeliveryState,
    Endpoint,
    PushBinding,
    PushConfig,
)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]{0,63}")
# Token and credentials travel in request headers: printable ASCII only (a newline or a
# non-ASCII character would make every delivery of the config fail to be sent).
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def credentials_problem(token: str, scheme: str, credentials: str) -> tuple[str, str] | None:
    """(field, why) when a token, auth scheme or credentials could not travel in a request
    header (a newline or a non-ASCII character would make every delivery fail), else None."""
    if len(token) > 1024 or not _HEADER_VALUE.fullmatch(token):
        return "token", "must be printable ASCII, at most 1024 characters"
    if scheme and not _SCHEME.fullmatch(scheme):
        return "authentication.scheme", "must be an HTTP auth scheme name"
    if len(credentials) > 4096 or not _HEADER_VALUE.fullmatch(credentials):
        return "authentication.credentials", "must be printable ASCII, at most 4 KiB"
    if credentials and not scheme:
        return "authentication.scheme", "is required with credentials"
    return None


@dataclass(frozen=True)
class CheckedConfig:
    """A push config `push_config_check` accepted: valid, and its URL's host resolved to
    addresses the SSRF policy permits."""

    cfg: a2a_pb2.TaskPushNotificationConfig


def push_config_check(config: dict[str, Any]) -> CheckedConfig:
    """Validate a push config and check its URL. Raises InvalidPayload.

    This resolves the URL's host, whose owner decides how long that takes: call it outside
    any transaction (the protocol runs it off its ORM threads, with a deadline:
    a2a_platform/protocol/operations.py)."""
    cfg = wire.parse_proto(config, a2a_pb2.TaskPushNotificationConfig, "config")
    if not cfg.url:
        raise InvalidPayload("url", "is required")
    if cfg.id and not CONFIG_ID.fullmatch(cfg.id):
        raise InvalidPayload(
            "id",
            "must be 1 to 255 of the characters A-Z a-z 0-9 . _ ~ - (and not '.' or '..')",
        )
    auth = cfg.authentication if cfg.HasField("authentication") else None
    problem = credentials_problem(
        cfg.token, auth.scheme if auth else "", auth.credentials if auth else ""
    )
    if auth is not None and not _SCHEME.fullmatch(auth.scheme):
        problem = ("authentication.scheme", "must be an HTTP auth scheme name")
    if problem:
        raise InvalidPayload(*problem)
    try:
        check_url_at_registration(cfg.url)
    except UnsafeDestination as exc:
        raise InvalidPayload("url", str(exc)) from None
    return CheckedConfig(cfg)


def body_bytes(payload: dict[str, Any]) -> str:
    """The exact text of a delivery body (signed and sent as is)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def normalize_origin(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def snapshot_body(task: Task) -> str:
    """A `task` StreamResponse of the task as it is now, with its artifacts."""
    artifacts = list(task.artifacts.order_by("id"))
    return body_bytes({"task": wire.task_json(task, artifacts=artifacts)})


def binding_fields(
    *, url: str, token: str, auth_scheme: str, credentials: str, issuer: str
) -> dict[str, Any]:
    """A binding version's fields from a client's config (secrets encrypted)."""
    return {
        "url": url,
        "token_encrypted": encrypt(token) if token else "",
        "auth_scheme": auth_scheme,
        "credentials_encrypted": encrypt(credentials) if credentials else "",
        "issuer": issuer[:2048],
    }


def copied_fields(binding: PushBinding, *, url: str) -> dict[str, Any]:
    """`binding`'s fields (its encrypted credentials as they are) at `url`."""
    return {
        "url": url,
        "token_encrypted": binding.token_encrypted,
        "auth_scheme": binding.auth_scheme,
        "credentials_encrypted": binding.credentials_encrypted,
        "issuer": binding.issuer,
    }


def binding_create(
    *, config: PushConfig, activated_at: datetime | None, **fields: Any
) -> PushBinding:
    """Version `config.current_version` of the config (the caller bumped it) with `fields`
    (`binding_fields`, `copied_fields`), on the endpoint row of the URL's origin.
    `activated_at` None: it takes deliveries only once a rebind activates it (what it is owed
    meanwhile is held)."""
    endpoint, _ = Endpoint.objects.get_or_create(origin=normalize_origin(fields["url"]))
    return PushBinding.objects.create(
        config=config,
        version=config.current_version,
        endpoint=endpoint,
        activated_at=activated_at,
        **fields,
    )


def snapshot_delivery(
    *, config: PushConfig, binding: PushBinding, task: Task, now: datetime, held: bool = False
) -> Delivery:
    """A snapshot delivery (the task as it is now, at its current seq) owed to `binding`;
    `held` while the binding waits for a rebind's notice."""
    return Delivery.objects.create(
        config=config,
        binding=binding,
        task=task,
        seq=task.last_seq,
        kind=DeliveryKind.SNAPSHOT,
        body=snapshot_body(task),
        next_attempt_at=now,
        state=DeliveryState.HELD if held else DeliveryState.PENDING,
    )
