"""An operator's test send to an endpoint (the console's "send test event", issue 16).

The test goes where real deliveries go and is signed as they are: the newest live binding on
the endpoint gives the URL, the credentials and the agent whose keys sign it
(webhooks/delivery/headers.py), and webhooks/delivery/transport.py sends it with the delivery
timeout, SSRF checks included. It is not a delivery: no outbox row, no attempt row, no retry,
and it touches neither the endpoint's failure streak nor its pause, so a test can never
dead-letter, pause or resume anything. Its outcome is returned (the admin shows it as a
message) and audited as an OperatorAction `send_test_event` with the status, the failure in
words and the latency.

The body is a StreamResponse a receiver can parse and tell apart (docs/webhooks-receiving.md,
"Test events"): a TaskStatusUpdateEvent about no task (a task and context id of its own,
fresh for each test, state TASK_STATE_UNSPECIFIED), its marker under TEST_EVENT_URI in
`metadata` (as the rebind notices carry theirs: A2A extensions may not add event kinds). It
goes with `X-A2A-Event-Kind: test` and `X-A2A-Task-Seq: 0`, and the X-A2A-Task-Id header and
any JWT name the test's own task id: no real task's update reaches a task's URL.
webhooks/receiver.py accepts it and says so (`VerifiedDelivery.is_test`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.models import OperatorAction
from tasks import wire
from webhooks.bindings import body_bytes
from webhooks.delivery import transport
from webhooks.delivery.headers import SigningKeyMissing, delivery_headers
from webhooks.delivery.outbox_store import Head
from webhooks.errors import WebhookError
from webhooks.models import Endpoint, PushBinding
from webhooks.receiver import TEST_EVENT_URI

TEST_EVENT_KIND = "test"


class TestSendRefused(WebhookError):
    """Nothing was sent: no live binding points at the endpoint, or its agent cannot sign."""

    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class TestSendResult:
    __test__ = False

    event_id: uuid.UUID
    url: str  # the binding's URL as the console shows it (no query values)
    channel: str  # config id and version
    status: int | None
    ok: bool
    detail: str  # the failure in words (transport.failure_detail); "" when it went well
    duration_ms: float


def _binding_for(endpoint: Endpoint) -> PushBinding:
    binding = (
        PushBinding.objects.filter(
            endpoint=endpoint,
            activated_at__isnull=False,
            retired_at__isnull=True,
            config__deleted_at__isnull=True,
        )
        .select_related("config__task")
        .order_by("-created_at", "-id")
        .first()
    )
    if binding is None:
        raise TestSendRefused(f"no live push config sends to {endpoint.origin}: nothing to test")
    return binding


def url_shown(url: str) -> str:
    """A receiver URL as the console shows it: scheme, host, port and path; a query (whose
    values may be a secret) as `?…`, user info never."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}" + ("?…" if parts.query else "")


def probe_body(
    *, event_id: uuid.UUID, actor: str, now, endpoint: Endpoint, channel: PushBinding
) -> dict:
    """The test event's body: a status update about a task of its own (fresh ids, never
    sent again), in no state, with the test's marker; nothing in it is a real task's."""
    return {
        "statusUpdate": {
            "taskId": str(uuid.uuid4()),
            "contextId": str(uuid.uuid4()),
            "status": {"state": "TASK_STATE_UNSPECIFIED", "timestamp": wire.timestamp_json(now)},
            "metadata": {
                TEST_EVENT_URI: {
                    "test": True,
                    "eventId": str(event_id),
                    "sentBy": actor[:150],
                    "sentAt": wire.timestamp_json(now),
                    "endpoint": endpoint.origin,
                    "channel": f"{channel.config.config_id}.v{channel.version}",
                }
            },
        }
    }


def endpoint_send_test(*, endpoint_pk: int, actor: str) -> TestSendResult:
    """Send one signed test event to the endpoint now (outside any transaction; the send
    waits at most A2A_WEBHOOK_TIMEOUT_SECONDS) and audit its outcome. Raises TestSendRefused
    when nothing can be sent; Endpoint.DoesNotExist for an unknown endpoint."""
    endpoint = Endpoint.objects.get(pk=endpoint_pk)
    binding = _binding_for(endpoint)
    config, task = binding.config, binding.config.task
    now = timezone.now()
    event_id = uuid.uuid4()
    event = probe_body(event_id=event_id, actor=actor, now=now, endpoint=endpoint, channel=binding)
    head = Head(
        config_pk=config.pk,
        pk=0,
        event_id=event_id,
        task_id=uuid.UUID(event["statusUpdate"]["taskId"]),
        seq=0,
        kind=TEST_EVENT_KIND,
        body=body_bytes(event),
        config_name=config.config_id,
        version=binding.version,
        url=binding.url,
        token_encrypted=binding.token_encrypted,
        auth_scheme=binding.auth_scheme,
        credentials_encrypted=binding.credentials_encrypted,
        issuer=binding.issuer,
        endpoint_pk=endpoint.pk,
        agent_pk=task.agent_id,
    )
    try:
        headers = delivery_headers(head, int(now.timestamp()))
    except SigningKeyMissing as exc:
        raise TestSendRefused(str(exc)) from None
    result = transport.post(
        binding.url, head.body, headers, timeout=settings.A2A_WEBHOOK_TIMEOUT_SECONDS
    )
    outcome = TestSendResult(
        event_id=head.event_id,
        url=url_shown(binding.url),
        channel=f"{config.config_id}.v{binding.version}",
        status=result.status,
        ok=result.ok,
        detail=transport.failure_detail(result),
        duration_ms=result.duration_ms,
    )
    with transaction.atomic(durable=True):
        OperatorAction.record(
            actor,
            "send_test_event",
            {
                "endpoint": endpoint.origin,
                "channel": outcome.channel,
                "event": str(outcome.event_id),
                "status": outcome.status,
                "detail": outcome.detail,
                "durationMs": outcome.duration_ms,
            },
        )
    return outcome
