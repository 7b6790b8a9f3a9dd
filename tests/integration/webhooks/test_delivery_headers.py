"""What a real delivery carries: the config's own credentials, and a signature by every live
key during a signing-key rotation.

A real worker process (tests.webhook_checks.start_worker) delivers to a real receiver process
(tests.webhook_receiver). The agent's executor is external, so the test itself moves the task
(through the lifecycle services) and decides when each event is written.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from django.utils import timezone

from agents.models import SigningKey
from agents.signing import (
    active_signing_key,
    jwks,
    signing_key_create,
    signing_key_retire,
    signing_key_rotate,
)
from tasks import services
from tasks.states import TaskState
from tests.deliveries import delivery_record
from tests.factories import AgentFactory
from tests.webhook_checks import (
    assert_delivered,
    assert_in_order,
    deliveries,
    open_task,
    start_worker,
    wait_all,
)
from tests.webhook_receiver import Record
from webhooks.delivery.claim_record import delivery_claim_batch
from webhooks.delivery.headers import SigningKeyMissing, delivery_headers
from webhooks.delivery.outbox_store import get_outbox_store
from webhooks.delivery.transport import TransportResult
from webhooks.models import Alert, AlertKind, Delivery, DeliveryAttempt, DeliveryState
from webhooks.receiver import VerificationError, WebhookVerifier

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]

ROOT_JWKS = "/.well-known/jwks.json"

# The worker reads an agent's signing keys once per A2A_SIGNING_KEY_CACHE_SECONDS (its
# production cache; shortened here to keep the test quick): a key change this process commits
# signs, or stops signing, there within that bound (tests/integration/test_cache_bounds.py
# checks the bound). So the next event is written once the bound has passed since the change.
SIGNING_KEY_CACHE_SECONDS = 1.0


def past_the_workers_key_cache(changed_at: float) -> None:
    """Wait until an entry the worker cached before `changed_at` (monotonic, system-wide on
    Linux) has expired: what any delivery it signs after that uses is the changed keys."""
    remaining = changed_at + SIGNING_KEY_CACHE_SECONDS - time.monotonic()
    if remaining > 0:
        time.sleep(remaining + 0.05)


def finish(task) -> None:
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)


def signatures(record: Record) -> list[str]:
    return record.header("webhook-signature").split()


# (authentication, the Authorization header the receiver must get)
EXPLICIT = {
    "basic": ({"scheme": "Basic", "credentials": "xyz"}, "Basic xyz"),
    "custom": ({"scheme": "X-Hook-Key", "credentials": "k3y-0f-hook"}, "X-Hook-Key k3y-0f-hook"),
    # Bearer with credentials of the client's: sent as given, not replaced by our JWT.
    "bearer": ({"scheme": "Bearer", "credentials": "opaque-t0ken"}, "Bearer opaque-t0ken"),
}


def test_explicit_credentials_reach_the_receiver_and_are_not_stored_with_the_attempts(
    agent, procs, receivers
):
    receiver = receivers.start()
    start_worker(procs)
    task, configs = open_task(
        agent,
        "hello",
        *[
            {"id": name, "url": receiver.url, "authentication": auth}
            for name, (auth, _) in EXPLICIT.items()
        ],
    )
    finish(task)
    for config in configs:
        wait_all(config, timeout=20)

    verifier = WebhookVerifier(jwks=jwks(agent))
    for config in configs:
        _, expected = EXPLICIT[config.config_id]
        event_ids = [str(d.event_id) for d in deliveries(config)]
        records = [r for r in receiver.records() if r.webhook_id in event_ids]
        assert [r.header("x-a2a-event-kind") for r in records] == ["snapshot", "status", "status"]
        assert_in_order(records, event_ids)
        for record in records:
            assert record.header("authorization") == expected
            assert record.header("x-a2a-binding-version") == f"{config.config_id}.v1"
            verified = verifier.verify(record.headers, record.body)
            assert verified.jwt_claims is None  # the client's credentials, not our JWT
            assert verified.event_id == record.webhook_id

        attempts = DeliveryAttempt.objects.filter(delivery__config=config)
        assert attempts.count() == len(event_ids)
        for attempt in attempts:
            assert attempt.status == 200
            assert attempt.request_headers["Authorization"] == "<redacted>"
            assert attempt.request_headers["webhook-id"] in event_ids  # the real headers
        stored = json.dumps(list(attempts.values_list("request_headers", flat=True)))
        assert expected.split(" ", 1)[1] not in stored


def test_during_a_key_rotation_each_delivery_carries_a_verifying_signature_per_live_key(
    agent, wire, procs, receivers
):
    """One key signs; after a rotation the active and the retiring key both sign (two `v1a`
    entries, each verifying against the published JWKS, so a receiver that knows only one of
    the keys still accepts); once the old key is retired only the new one signs."""
    assert agent.is_default  # its JWKS is published at the origin root too
    old = active_signing_key(agent)  # the key it was created with
    receiver = receivers.start()
    start_worker(procs, A2A_SIGNING_KEY_CACHE_SECONDS=str(SIGNING_KEY_CACHE_SECONDS))
    task, (config,) = open_task(agent, "hello", {"url": receiver.url})
    (before,) = receiver.wait_for(lambda rs: len(rs) == 1, timeout=20, message="the snapshot")
    assert signatures(before)[0].startswith("v1a,")
    assert len(signatures(before)) == 1
    assert before.header("x-a2a-signature-key-ids") == old.kid

    new = signing_key_rotate(agent=agent)
    rotated_at = time.monotonic()
    published = wire.request("GET", ROOT_JWKS).json()
    assert [key["kid"] for key in published["keys"]] == [new.kid, old.kid]
    past_the_workers_key_cache(rotated_at)
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    during = receiver.wait_for(lambda rs: len(rs) == 2, timeout=20, message="the rotated")[1]

    entries = signatures(during)
    assert len(entries) == 2, entries
    assert all(entry.startswith("v1a,") for entry in entries)
    assert len(set(entries)) == 2
    assert during.header("x-a2a-signature-key-ids").split() == [new.kid, old.kid]
    # Each entry on its own verifies against the published JWKS, by the key the hint names.
    verifier = WebhookVerifier(jwks=published)
    signed_by = [
        verifier.verify({**during.headers, "webhook-signature": entry}, during.body).key_id
        for entry in entries
    ]
    assert signed_by == [new.kid, old.kid]
    # A receiver that has only fetched one of the keys accepts the delivery either way.
    for jwk in published["keys"]:
        one_key = WebhookVerifier(jwks={"keys": [jwk]})
        assert one_key.verify(during.headers, during.body).key_id == jwk["kid"]

    signing_key_retire(key_id=old.pk, actor="test")
    past_the_workers_key_cache(time.monotonic())
    services.task_transition(task_id=task.pk, to_state=TaskState.COMPLETED)
    after = receiver.wait_for(lambda rs: len(rs) == 3, timeout=20, message="the last")[2]
    assert len(signatures(after)) == 1
    assert after.header("x-a2a-signature-key-ids") == new.kid
    assert [key["kid"] for key in wire.request("GET", ROOT_JWKS).json()["keys"]] == [new.kid]
    old_only = WebhookVerifier(jwks={"keys": [published["keys"][1]]})
    with pytest.raises(VerificationError) as refused:
        old_only.verify(after.headers, after.body)
    assert refused.value.reason == "signature"

    wait_all(config, timeout=20)
    # Every delivery verifies against the JWKS published during the rotation (both keys).
    assert_delivered(receiver, config, agent, jwks_doc=published)


def test_a_keyless_agents_head_is_not_signed_and_no_key_is_created():
    """The delivery path only reads keys: an agent without a live one (made outside the
    services) cannot sign, so its heads raise SigningKeyMissing rather than leave unsigned,
    and nothing writes a key on the way."""
    agent = AgentFactory(slug="keyless", executor="external", signing_key=False)
    task, (config,) = open_task(agent, "hello", {"url": "http://127.0.0.1:9/hook"})
    (head,) = get_outbox_store().claim_read(timezone.now(), 1, [config.pk])
    with pytest.raises(SigningKeyMissing, match="keyless"):
        delivery_headers(head, int(time.time()))
    assert not SigningKey.objects.filter(agent=agent).exists()


OK = TransportResult(
    status=200, headers={}, body_excerpt="", duration_ms=1.0, error_class=None, retry_after=None
)


@pytest.mark.parametrize("store", ["postgres", "orm"])
def test_a_keyless_agents_deliveries_wait_alerted_while_others_go_until_it_has_a_key(
    store, settings, time_machine, caplog
):
    """In a claim, a keyless agent's head is held (webhooks/delivery/claim_record.py): no try
    spent, no attempt row, nothing sent unsigned; it is logged, alerted (one open alert, counted at
    each look) and looked at again a sweep interval later, while the other agents' heads of the
    same batch are claimed. Once the agent has a key, its delivery goes, signed by it."""
    settings.A2A_STORE = store
    time_machine.move_to(timezone.now(), tick=False)
    sweep = settings.A2A_WEBHOOK_SWEEP_INTERVAL_SECONDS
    keyed = AgentFactory(slug="keyed", executor="external")
    keyless = AgentFactory(slug="keyless", executor="external", signing_key=False)
    _, (sent,) = open_task(keyed, "hello", {"url": "http://127.0.0.1:9/hook"})
    _, (held,) = open_task(keyless, "hello", {"url": "http://127.0.0.1:19/hook"})
    (waiting,) = Delivery.objects.filter(config=held)

    def still_waiting() -> None:
        waiting.refresh_from_db()
        assert (waiting.state, waiting.attempts) == (DeliveryState.PENDING, 0)
        assert not DeliveryAttempt.objects.filter(delivery=waiting).exists()
        assert not SigningKey.objects.filter(agent=keyless).exists()

    with caplog.at_level(logging.ERROR, logger="webhooks.delivery.claim_record"):
        batch = delivery_claim_batch(limit=10)
    assert [claim.config_pk for claim in batch.claims] == [sent.pk]  # the others still go
    delivery_record(claim=batch.claims[0], result=OK)
    still_waiting()
    (logged,) = [r for r in caplog.records if r.getMessage() == "webhooks.delivery.unsigned_held"]
    assert logged.agent == "keyless"
    alert = Alert.objects.get(kind=AlertKind.SIGNING_KEY_MISSING, resolved_at__isnull=True)
    assert "'keyless'" in alert.message
    assert "127.0.0.1:19" in alert.message
    assert alert.endpoint.origin == "http://127.0.0.1:19"

    # Visibly waiting: not claimed again before the sweep interval, then held again.
    time_machine.shift(sweep - 1)
    assert delivery_claim_batch(limit=10).claims == ()
    time_machine.shift(2)
    assert delivery_claim_batch(limit=10).claims == ()
    still_waiting()
    alert.refresh_from_db()
    assert alert.count == 2
    assert Alert.objects.filter(kind=AlertKind.SIGNING_KEY_MISSING).count() == 1

    key = signing_key_create(agent=keyless)
    time_machine.shift(sweep + 1)
    (claim,) = delivery_claim_batch(limit=10).claims
    assert (claim.delivery_pk, claim.attempt_number) == (waiting.pk, 1)
    assert delivery_record(claim=claim, result=OK).state == "delivered"
    waiting.refresh_from_db()
    assert (waiting.state, waiting.attempts) == (DeliveryState.DELIVERED, 1)
    verified = WebhookVerifier(jwks=jwks(keyless)).verify(claim.headers, claim.body)
    assert verified.event_id == str(waiting.event_id)
    assert claim.headers["X-A2A-Signature-Key-Ids"] == key.kid
