"""A claimed delivery's request headers: the A2A headers, the Standard Webhooks signature
with every live key of the agent, the notification token and the Authorization header (a
Bearer JWT signed by the agent when the binding gives no credentials), and their redaction
for the attempt row. The agent's signing keys are cached per process (`_signers`).

Read only: keys are created with their agent (agent_create, migration 0006), never here. An
agent without a live key cannot sign, and an unsigned delivery is never sent:
`SigningKeyMissing` is raised for its heads (webhooks/delivery/claim_record.py keeps them back).
"""

from __future__ import annotations

from typing import NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from a2a_platform.lib.crypto import decrypt
from a2a_platform.lib.tracing import inject_task_trace
from a2a_platform.lib.ttl_cache import TTLCache
from agents.models import Agent, SigningKey
from agents.signing import live_private_keys
from webhooks.delivery.outbox_store import Head
from webhooks.delivery.signer import bearer_jwt, webhook_headers

SECRET_HEADERS = {"authorization", "x-a2a-notification-token"}


class SigningKeyMissing(Exception):
    """The agent has no live signing key, so its deliveries cannot be signed (and are not sent
    unsigned). Not cached: the key an operator then creates signs at once here."""

    def __init__(self, agent_pk: int, slug: str) -> None:
        super().__init__(f"agent {slug!r} has no live signing key; its deliveries are held")
        self.agent_pk = agent_pk
        self.slug = slug


class _Signer(NamedTuple):
    keys: list  # the agent's live private keys, the active one first
    slug: str  # the JWT issuer when the binding names none


# Per process: a key created, rotated or retired elsewhere signs (or stops) here within
# A2A_SIGNING_KEY_CACHE_SECONDS; in this process at once, on commit (below).
_signers: TTLCache[_Signer] = TTLCache(lambda: settings.A2A_SIGNING_KEY_CACHE_SECONDS)


def _signing_key_changed(sender, instance: SigningKey, using: str = "default", **_) -> None:
    agent_pk = instance.agent_id
    transaction.on_commit(lambda: _signers.discard(agent_pk), using=using)


post_save.connect(_signing_key_changed, sender=SigningKey, dispatch_uid="webhooks.signer_saved")
post_delete.connect(_signing_key_changed, sender=SigningKey, dispatch_uid="webhooks.signer_del")


def _signer(agent_pk: int) -> _Signer:
    signer = _signers.get(agent_pk)
    if signer is None:
        agent = Agent.objects.get(pk=agent_pk)
        keys = live_private_keys(agent)
        if not keys:
            raise SigningKeyMissing(agent_pk, agent.slug)
        signer = _signers.put(agent_pk, _Signer(keys, agent.slug))
    return signer


def delivery_headers(head: Head, now_ts: int) -> dict[str, str]:
    """The headers of one send of `head`, signed at `now_ts` (secrets in clear). Raises
    SigningKeyMissing when the agent has no live key."""
    keys, slug = _signer(head.agent_pk)
    body = head.body.encode()
    binding_version = f"{head.config_name}.v{head.version}"
    headers = {
        "Content-Type": "application/a2a+json",
        "X-A2A-Task-Id": str(head.task_id),
        "X-A2A-Task-Seq": str(head.seq),
        "X-A2A-Binding-Version": binding_version,
        "X-A2A-Event-Kind": head.kind,
        **webhook_headers(msg_id=str(head.event_id), timestamp=now_ts, body=body, keys=keys),
    }
    # The task's trace continues at the receiver (docs/webhooks-receiving.md, "Continue the
    # trace"): W3C traceparent and tracestate, outside the signature like any header. The
    # pump names its attempt span in them instead when spans are exported.
    inject_task_trace(headers, head.traceparent, head.tracestate)
    if head.token_encrypted:
        headers["X-A2A-Notification-Token"] = decrypt(head.token_encrypted)
    if head.auth_scheme:
        credentials = decrypt(head.credentials_encrypted) if head.credentials_encrypted else ""
        if not credentials and head.auth_scheme.lower() == "bearer" and keys:
            credentials = bearer_jwt(
                key=keys[0],
                issuer=head.issuer or slug,
                audience=head.url,
                task_id=str(head.task_id),
                event_id=str(head.event_id),
                body=body,
                seq=head.seq,
                binding_version=binding_version,
            )
        headers["Authorization"] = f"{head.auth_scheme} {credentials}".strip()
    return headers


def redact(headers: dict[str, str]) -> dict[str, str]:
    """The headers as an attempt row stores them: secrets replaced."""
    return {k: ("<redacted>" if k.lower() in SECRET_HEADERS else v) for k, v in headers.items()}
