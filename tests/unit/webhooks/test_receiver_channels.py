"""webhooks.receiver.ChannelTrust: per-task channel history across a two-phase rebind."""

from __future__ import annotations

import json
import threading

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.unit.webhooks.test_receiver import NOW, TASK, Sender, Sent, jwks, status_body
from webhooks.receiver import (
    PUSH_CHANNEL_EXTENSION_URI,
    Channel,
    ChannelError,
    ChannelNotice,
    ChannelTrust,
    VerificationError,
    VerifiedDelivery,
    WebhookVerifier,
    parse_channel_notice,
)

V1, V2, V3 = "cfg-1.v1", "cfg-1.v2", "cfg-1.v3"
ORIGIN = "https://client.example:443"
JWKS_URL = "https://agents.example/a/.well-known/jwks.json"
REBIND = "5f0c2a8e-2222-4c1e-9d0b-6a3d2f1e0002"


class V1Sender(Sender):
    """The test_receiver Sender, delivering under cfg-1.v1 unless told otherwise."""

    def deliver(self, *, binding_version: str | None = V1, **kw) -> Sent:
        return super().deliver(binding_version=binding_version, **kw)


def notice_body(
    *,
    kind: str = "channel-changed",
    old: tuple[str, list[str]] = (V1, ["kid-a"]),
    new: tuple[str, list[str]] | None = (V2, ["kid-a"]),
    from_seq: int | None = 7,
    task_id: str = TASK,
    **extra,
) -> bytes:
    payload = {
        "notice": kind,
        "rebindId": REBIND,
        "policy": "drain" if kind == "channel-changed" else "cutover",
        "oldChannel": {"version": old[0], "keyIds": old[1]},
        "jwksUrl": JWKS_URL,
        **extra,
    }
    if new is not None:
        payload["newChannel"] = {
            "version": new[0],
            "origin": ORIGIN,
            "pathPrefix": "/hooks/v2/",
            "keyIds": new[1],
        }
    if from_seq is not None:
        payload["fromSeq"] = from_seq
    body = {
        "statusUpdate": {
            "taskId": task_id,
            "contextId": "c",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": "2025-06-15T00:00:00Z"},
            "metadata": {PUSH_CHANNEL_EXTENSION_URI: payload},
        }
    }
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.fixture
def key_a():
    return ("kid-a", Ed25519PrivateKey.generate())


@pytest.fixture
def key_b():
    return ("kid-b", Ed25519PrivateKey.generate())


@pytest.fixture
def key_c():
    return ("kid-c", Ed25519PrivateKey.generate())


def verifier_for(*pairs, **kw) -> WebhookVerifier:
    kw.setdefault("clock", lambda: NOW)
    return WebhookVerifier(jwks=jwks(*pairs), **kw)


class Receiver:
    """A verifier and a ChannelTrust, used the way docs/webhooks-receiving.md shows."""

    def __init__(self, verifier: WebhookVerifier, channels: ChannelTrust | None = None) -> None:
        self.verifier = verifier
        self.channels = ChannelTrust() if channels is None else channels

    def receive(self, sent) -> VerifiedDelivery:
        return self.verifier.verify(sent.headers, sent.body, channels=self.channels)

    def refused(self, sent) -> VerificationError:
        with pytest.raises(VerificationError) as info:
            self.receive(sent)
        return info.value


def test_push_channel_extension_uri_is_the_platforms():
    assert PUSH_CHANNEL_EXTENSION_URI == "urn:a2a-platform:ext:push-channel:v1"


# --- trust on first use -------------------------------------------------------------------


def test_channels_trust_the_first_delivery_of_a_task(key_a):
    receiver = Receiver(verifier_for(key_a))
    delivery = receiver.receive(V1Sender([key_a]).deliver(binding_version=V1))
    assert delivery.key_id == "kid-a"
    assert receiver.channels.channels(TASK) == (Channel(V1, ("kid-a",)),)
    assert receiver.channels.channels("another-task") == ()
    assert receiver.channels.task_count() == 1


def test_channels_first_use_trusts_the_kid_that_verified_only(key_a, key_b):
    # Signed by both live keys; the hint puts kid-b first, so kid-b is the one trusted.
    receiver = Receiver(verifier_for(key_a, key_b))
    receiver.receive(V1Sender([key_b, key_a]).deliver(binding_version=V1))
    assert receiver.channels.channels(TASK) == (Channel(V1, ("kid-b",)),)


def test_channels_without_trust_on_first_use_refuse_an_unknown_task(key_a):
    receiver = Receiver(verifier_for(key_a), ChannelTrust(trust_on_first_use=False))
    error = receiver.refused(V1Sender([key_a]).deliver(binding_version=V1))
    assert isinstance(error, ChannelError)
    assert "unknown" in error.why
    assert error.trusted == ()


def test_channels_trust_restores_a_persisted_history(key_a):
    channels = ChannelTrust(trust_on_first_use=False)
    channels.trust(TASK, V2, ["kid-a"])
    receiver = Receiver(verifier_for(key_a), channels)
    assert receiver.receive(V1Sender([key_a]).deliver(binding_version=V2)).key_id == "kid-a"
    assert isinstance(receiver.refused(V1Sender([key_a]).deliver(binding_version=V1)), ChannelError)
    with pytest.raises(ValueError, match="key id"):
        channels.trust(TASK, V3, [])


def test_channels_prefer_the_tasks_kid_among_several_signatures(key_a, key_b):
    # Restored by name only (no pinned bytes yet); signed by both keys, kid-b hinted first.
    channels = ChannelTrust(trust_on_first_use=False)
    channels.trust(TASK, V1, ["kid-a"])
    receiver = Receiver(verifier_for(key_a, key_b), channels)
    assert receiver.receive(V1Sender([key_b, key_a]).deliver()).key_id == "kid-a"


# --- rejection ----------------------------------------------------------------------------


def test_channels_refuse_an_untrusted_version_naming_everything(key_a):
    receiver = Receiver(verifier_for(key_a))
    sender = V1Sender([key_a])
    receiver.receive(sender.deliver(event_id="e1", binding_version=V1))
    error = receiver.refused(sender.deliver(event_id="e2", seq=2, binding_version=V3))
    assert isinstance(error, ChannelError)
    assert error.reason == "channel"
    assert error.task_id == TASK
    assert error.offered_version == V3
    assert error.key_id == "kid-a"
    assert error.offered_key_ids == ("kid-a",)
    assert error.trusted == (Channel(V1, ("kid-a",)),)
    assert error.orphaned is False
    assert error.delivery.event_id == "e2"
    message = str(error)
    for part in (TASK, V3, "kid-a", f"{V1} [kid-a]"):
        assert part in message
    # Nothing was learned from the refused delivery.
    assert receiver.channels.channels(TASK) == (Channel(V1, ("kid-a",)),)


def test_channels_refuse_a_key_the_task_does_not_trust(key_a, key_b):
    receiver = Receiver(verifier_for(key_a, key_b))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    error = receiver.refused(V1Sender([key_b]).deliver(event_id="e2", binding_version=V1))
    assert isinstance(error, ChannelError)
    assert error.key_id == "kid-b"
    assert "kid-b" in error.why
    assert error.trusted == (Channel(V1, ("kid-a",)),)


def test_channels_follow_jwks_rotation_accepts_a_jwks_key_on_a_trusted_version(key_a, key_b):
    receiver = Receiver(verifier_for(key_a, key_b), ChannelTrust(follow_jwks_rotation=True))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    assert receiver.receive(V1Sender([key_b]).deliver(event_id="e2", binding_version=V1))
    assert receiver.channels.channels(TASK) == (Channel(V1, ("kid-a", "kid-b")),)
    # The version still has to be one the task trusts.
    error = receiver.refused(V1Sender([key_b]).deliver(event_id="e3", binding_version=V2))
    assert isinstance(error, ChannelError)
    assert V2 in error.why


def test_channels_refuse_a_delivery_naming_no_task(key_a):
    receiver = Receiver(verifier_for(key_a))
    error = receiver.refused(V1Sender([key_a]).deliver(body=b'{"other": 1}', task_header=None))
    assert isinstance(error, ChannelError)
    assert error.task_id is None
    assert receiver.channels.task_count() == 0


def test_channels_refuse_a_delivery_without_binding_version(key_a):
    receiver = Receiver(verifier_for(key_a))
    error = receiver.refused(V1Sender([key_a]).deliver(binding_version=None))
    assert isinstance(error, ChannelError)
    assert error.task_id == TASK
    assert "X-A2A-Binding-Version" in error.why


def test_channels_other_checks_come_first(key_a):
    # A forged delivery is a signature failure, not a channel one.
    receiver = Receiver(verifier_for(key_a))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    forged = V1Sender([("kid-a", Ed25519PrivateKey.generate())]).deliver(binding_version=V3)
    assert receiver.refused(forged).reason == "signature"


# --- notices ------------------------------------------------------------------------------


def test_channels_notice_on_the_old_channel_teaches_the_new_one(key_a):
    receiver = Receiver(verifier_for(key_a))
    sender = V1Sender([key_a])
    receiver.receive(sender.deliver(event_id="e1", seq=5, binding_version=V1))
    new_before = sender.deliver(event_id="e7", seq=7, binding_version=V2)
    assert isinstance(receiver.refused(new_before), ChannelError)

    notice = receiver.receive(sender.deliver(event_id="e6", seq=6, body=notice_body()))
    assert parse_channel_notice(notice).new_channel.version == V2
    assert receiver.channels.channels(TASK) == (
        Channel(V1, ("kid-a",)),
        Channel(V2, ("kid-a",), ORIGIN, "/hooks/v2/"),
    )
    assert receiver.receive(new_before).binding_version == V2


def test_channels_old_channel_is_still_accepted_after_the_move(key_a, key_b):
    receiver = Receiver(verifier_for(key_a, key_b))
    old = V1Sender([key_a])
    receiver.receive(old.deliver(event_id="e1", seq=1, binding_version=V1))
    receiver.receive(
        V1Sender([key_b, key_a]).deliver(
            event_id="e6", seq=6, body=notice_body(new=(V2, ["kid-b"]))
        )
    )
    receiver.receive(V1Sender([key_b]).deliver(event_id="e7", seq=7, binding_version=V2))
    # A late retry of an event owed to the old channel, before and after the old key retired.
    assert receiver.receive(old.deliver(event_id="e5", seq=5, binding_version=V1))
    late = V1Sender([key_b]).deliver(event_id="e4", seq=4, binding_version=V1)
    assert receiver.receive(late).key_id == "kid-b"


def test_channels_key_only_rotation_pins_the_new_key(key_a, key_b, key_c):
    published = {"jwks": jwks(key_a)}
    fetches = []

    def fetch(url):
        fetches.append(url)
        if published["jwks"] is None:
            raise OSError("JWKS unreachable")
        return published["jwks"]

    verifier = WebhookVerifier(
        jwks_url=JWKS_URL, fetch=fetch, clock=lambda: NOW, min_refresh_seconds=0
    )
    receiver = Receiver(verifier)
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", seq=1, binding_version=V1))
    assert len(fetches) == 1

    # The rebind publishes kid-b; its notice (same URL, version n+1) is signed by both keys.
    published["jwks"] = jwks(key_b, key_a)
    body = notice_body(old=(V1, ["kid-a"]), new=(V2, ["kid-b"]), from_seq=3)
    receiver.receive(V1Sender([key_b, key_a]).deliver(event_id="e2", seq=2, body=body))
    assert len(fetches) == 2  # the notice named a kid the verifier did not hold
    assert receiver.channels.channels(TASK)[-1] == Channel(V2, ("kid-b",), ORIGIN, "/hooks/v2/")

    # kid-a retires, kid-b is unpublished too (a broken or hostile JWKS): the JWKS the
    # verifier holds now has neither, and the task's pinned keys still verify it.
    published["jwks"] = jwks(key_c)
    assert verifier.refresh() is True
    assert verifier.key_ids == ("kid-c",)
    new = V1Sender([key_b]).deliver(event_id="e3", seq=3, binding_version=V2)
    assert receiver.receive(new).key_id == "kid-b"
    late = V1Sender([key_a]).deliver(event_id="e1", seq=1, binding_version=V1)
    assert receiver.receive(late).key_id == "kid-a"
    # ... and unreachable: nothing is fetched for a task whose pinned key verifies.
    published["jwks"] = None
    before = len(fetches)
    assert receiver.receive(new).key_id == "kid-b"
    assert len(fetches) == before
    # A key the task never trusted does not sign for it, though the JWKS lists it.
    stranger = V1Sender([key_c]).deliver(event_id="e4", seq=4, binding_version=V2)
    assert isinstance(receiver.refused(stranger), ChannelError)


def test_channels_new_kid_unknown_at_notice_time_is_resolved_on_first_use(key_a, key_b):
    published = {"jwks": jwks(key_a)}
    ticks = {"now": 1000.0}
    verifier = WebhookVerifier(
        jwks_url=JWKS_URL,
        fetch=lambda url: published["jwks"],
        clock=lambda: NOW,
        monotonic=lambda: ticks["now"],
    )
    receiver = Receiver(verifier)
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    # kid-b is published, but the refresh the notice asks for is rate-limited away.
    published["jwks"] = jwks(key_a, key_b)
    receiver.receive(
        V1Sender([key_a]).deliver(event_id="e2", body=notice_body(new=(V2, ["kid-b"])))
    )
    assert "kid-b" not in verifier.key_ids
    ticks["now"] += 61
    new = V1Sender([key_b]).deliver(event_id="e3", binding_version=V2)
    assert receiver.receive(new).key_id == "kid-b"


def test_channels_pinned_key_wins_over_a_republished_kid(key_a):
    published = {"jwks": jwks(key_a)}
    verifier = WebhookVerifier(
        jwks_url=JWKS_URL,
        fetch=lambda url: published["jwks"],
        clock=lambda: NOW,
        min_refresh_seconds=0,
    )
    receiver = Receiver(verifier)
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    impostor = ("kid-a", Ed25519PrivateKey.generate())
    published["jwks"] = jwks(impostor)
    verifier.refresh()
    sent = V1Sender([impostor]).deliver(event_id="e2", binding_version=V1)
    assert verifier.verify(sent.headers, sent.body).key_id == "kid-a"  # the JWKS alone
    assert receiver.refused(sent).reason == "signature"  # the task pinned kid-a's bytes


def test_channels_forged_notice_teaches_nothing(key_a, key_b):
    receiver = Receiver(verifier_for(key_a))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    # Signed by a key outside the JWKS, hinted as the trusted kid.
    forged = V1Sender([key_b]).deliver(event_id="e2", body=notice_body(new=(V3, ["kid-b"])))
    forged.headers["X-A2A-Signature-Key-Ids"] = "kid-a"
    assert receiver.refused(forged).reason == "signature"
    # Signed properly, then its newChannel rewritten.
    tampered = V1Sender([key_a]).deliver(event_id="e3", body=notice_body(new=(V2, ["kid-a"])))
    tampered.body = tampered.body.replace(V2.encode(), V3.encode())
    assert receiver.refused(tampered).reason == "signature"
    # Unsigned.
    unsigned = V1Sender([key_a]).deliver(event_id="e4", body=notice_body(new=(V3, ["kid-a"])))
    del unsigned.headers["webhook-signature"]
    assert receiver.refused(unsigned).reason == "headers"

    assert receiver.channels.channels(TASK) == (Channel(V1, ("kid-a",)),)
    later = V1Sender([key_a]).deliver(event_id="e5", binding_version=V3)
    assert isinstance(receiver.refused(later), ChannelError)


def test_channels_notice_on_an_untrusted_channel_teaches_nothing(key_a, key_b):
    receiver = Receiver(verifier_for(key_a, key_b))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    # Under a version the task never trusted (the notice names it as its old channel).
    body = notice_body(old=(V3, ["kid-a"]), new=(V2, ["kid-a"]))
    error = receiver.refused(
        V1Sender([key_a]).deliver(event_id="e2", body=body, binding_version=V3)
    )
    assert isinstance(error, ChannelError)
    # On the right version, but signed only by an agent key this task does not trust.
    body = notice_body(new=(V2, ["kid-b"]))
    error = receiver.refused(V1Sender([key_b]).deliver(event_id="e3", body=body))
    assert isinstance(error, ChannelError)
    assert error.key_id == "kid-b"

    assert receiver.channels.channels(TASK) == (Channel(V1, ("kid-a",)),)
    assert isinstance(
        receiver.refused(V1Sender([key_b]).deliver(event_id="e4", binding_version=V2)),
        ChannelError,
    )


def test_channels_notice_must_name_the_version_it_arrived_under(key_a):
    receiver = Receiver(verifier_for(key_a))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    receiver.channels.trust(TASK, V3, ["kid-a"])
    # Delivered under V1 but claiming to retire V3: a platform fault, refused loudly.
    body = notice_body(old=(V3, ["kid-a"]), new=(V2, ["kid-a"]))
    error = receiver.refused(V1Sender([key_a]).deliver(event_id="e2", body=body))
    assert error.reason == "payload"
    assert "oldChannel.version" in str(error)
    assert [c.version for c in receiver.channels.channels(TASK)] == [V1, V3]


def test_channels_notice_adds_the_old_channels_key_ids(key_a, key_b):
    receiver = Receiver(verifier_for(key_a, key_b))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", binding_version=V1))
    body = notice_body(old=(V1, ["kid-a", "kid-b"]), new=(V2, ["kid-b"]))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e2", body=body))
    assert receiver.channels.channels(TASK)[0] == Channel(V1, ("kid-a", "kid-b"))


def test_channels_a_first_delivery_that_is_a_notice_is_trusted_and_teaches(key_a):
    # A receiver that restarted mid-drain: the notice is the first it sees of the task.
    receiver = Receiver(verifier_for(key_a))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e6", body=notice_body()))
    assert [c.version for c in receiver.channels.channels(TASK)] == [V1, V2]


def test_channels_orphaned_notice_marks_the_task(key_a, key_b):
    receiver = Receiver(verifier_for(key_a, key_b))
    sender = V1Sender([key_a])
    receiver.receive(sender.deliver(event_id="e1", seq=1, binding_version=V1))
    assert receiver.channels.is_orphaned(TASK) is False
    body = notice_body(kind="channel-orphaned", new=None, from_seq=None)
    delivery = receiver.receive(sender.deliver(event_id="e3", seq=3, body=body))
    assert parse_channel_notice(delivery).kind == "channel-orphaned"
    assert receiver.channels.is_orphaned(TASK) is True
    assert receiver.channels.channels(TASK) == (Channel(V1, ("kid-a",)),)
    # A late retry on the old channel is still accepted, and the task stays orphaned.
    assert receiver.receive(sender.deliver(event_id="e2", seq=2, binding_version=V1))
    assert receiver.channels.is_orphaned(TASK) is True
    # Bound anew (cfg-2): trusted on first use again, kept beside the old channel.
    rebound = V1Sender([key_b]).deliver(event_id="e4", seq=4, binding_version="cfg-2.v1")
    assert receiver.receive(rebound).key_id == "kid-b"
    assert receiver.channels.is_orphaned(TASK) is False
    assert receiver.channels.channels(TASK) == (
        Channel(V1, ("kid-a",)),
        Channel("cfg-2.v1", ("kid-b",)),
    )


def test_channels_an_orphan_rebound_under_dual_signatures_trusts_the_new_key(key_a, key_b):
    """A cutover with a key rotation, then a re-bind: the new channel's first delivery is
    signed by the new key and the retiring one (kid-a, the key the task's old channel was
    pinned to). Before, the old pin verified it first, so the new channel trusted kid-a alone
    and every delivery was refused once kid-a retired (found on `make run`)."""
    receiver = Receiver(verifier_for(key_a, key_b))
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", seq=1, binding_version=V1))
    body = notice_body(kind="channel-orphaned", new=None, from_seq=None)
    receiver.receive(V1Sender([key_b, key_a]).deliver(event_id="e2", seq=2, body=body))
    assert receiver.channels.is_orphaned(TASK) is True
    # Re-bound: a snapshot on V2 signed by both live keys, the new one hinted first.
    rebound = V1Sender([key_b, key_a]).deliver(event_id="e3", seq=2, binding_version=V2)
    assert receiver.receive(rebound).key_id == "kid-b"
    assert Channel(V2, ("kid-b",)) in receiver.channels.channels(TASK)
    # kid-a retires: the new channel keeps verifying with the key it trusted.
    later = Receiver(verifier_for(key_b), receiver.channels)
    assert later.receive(V1Sender([key_b]).deliver(event_id="e4", seq=3, binding_version=V2))
    # A late retry on the old channel while orphaned still verifies with its pin.
    receiver = Receiver(verifier_for(key_a, key_b))
    receiver.receive(V1Sender([key_a]).deliver(event_id="f1", seq=1, binding_version=V1))
    receiver.receive(V1Sender([key_a]).deliver(event_id="f2", seq=2, body=body))
    late = receiver.receive(V1Sender([key_b, key_a]).deliver(event_id="f0", binding_version=V1))
    assert (late.key_id, receiver.channels.is_orphaned(TASK)) == ("kid-a", True)


def test_channels_orphaned_task_without_trust_on_first_use_stays_refused(key_a):
    channels = ChannelTrust(trust_on_first_use=False)
    channels.trust(TASK, V1, ["kid-a"])
    receiver = Receiver(verifier_for(key_a), channels)
    body = notice_body(kind="channel-orphaned", new=None, from_seq=None)
    receiver.receive(V1Sender([key_a]).deliver(event_id="e1", body=body))
    error = receiver.refused(V1Sender([key_a]).deliver(event_id="e2", binding_version="cfg-2.v1"))
    assert isinstance(error, ChannelError)
    assert error.orphaned is True
    assert "(orphaned)" in str(error)


# --- bounds -------------------------------------------------------------------------------


def test_channels_evict_the_least_recently_used_task(key_a):
    channels = ChannelTrust(max_tasks=2)
    receiver = Receiver(verifier_for(key_a), channels)
    sender = V1Sender([key_a])

    def deliver(task: str, event: str):
        return sender.deliver(event_id=event, body=status_body(task), task_header=task)

    receiver.receive(deliver("t1", "e1"))
    receiver.receive(deliver("t2", "e2"))
    receiver.receive(deliver("t1", "e3"))  # t1 used again: t2 is now the oldest
    receiver.receive(deliver("t3", "e4"))
    assert channels.task_count() == 2
    assert channels.channels("t2") == ()
    assert channels.channels("t1") != ()
    assert channels.channels("t3") != ()
    with pytest.raises(ValueError, match="at least 1"):
        ChannelTrust(max_tasks=0)


def test_channels_keep_at_most_max_channels_per_task(key_a):
    receiver = Receiver(verifier_for(key_a), ChannelTrust(max_channels_per_task=2))
    sender = V1Sender([key_a])
    receiver.receive(sender.deliver(event_id="e1", binding_version=V1))
    receiver.receive(sender.deliver(event_id="e2", body=notice_body(old=(V1, ["kid-a"]))))
    body = notice_body(old=(V2, ["kid-a"]), new=(V3, ["kid-a"]))
    receiver.receive(sender.deliver(event_id="e3", body=body, binding_version=V2))
    assert [c.version for c in receiver.channels.channels(TASK)] == [V2, V3]
    assert isinstance(
        receiver.refused(sender.deliver(event_id="e4", binding_version=V1)), ChannelError
    )


def test_channels_forget_task(key_a):
    channels = ChannelTrust()
    channels.trust(TASK, V1, ["kid-a"])
    channels.forget_task(TASK)
    assert channels.channels(TASK) == ()
    assert channels.task_count() == 0


def test_channels_concurrent_deliveries(key_a):
    channels = ChannelTrust(max_tasks=1_000)
    receiver = Receiver(verifier_for(key_a), channels)
    sender = V1Sender([key_a])
    sent = [
        sender.deliver(event_id=f"e{t}-{n}", body=status_body(f"t{t}"), task_header=f"t{t}")
        for t in range(20)
        for n in range(5)
    ]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(part: list) -> None:
        barrier.wait()
        for item in part:
            try:
                receiver.receive(item)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(sent[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert channels.task_count() == 20
    assert all(channels.channels(f"t{t}") == (Channel(V1, ("kid-a",)),) for t in range(20))


# --- parse_channel_notice -----------------------------------------------------------------


def verified(body: bytes) -> VerifiedDelivery:
    payload = json.loads(body)
    return VerifiedDelivery(
        event_id="e1",
        task_id=TASK,
        seq=6,
        binding_version=V1,
        timestamp=NOW,
        payload=payload,
        key_id="kid-a",
    )


def test_parse_channel_notice_reads_every_field():
    notice = parse_channel_notice(verified(notice_body()))
    assert notice == ChannelNotice(
        kind="channel-changed",
        task_id=TASK,
        rebind_id=REBIND,
        policy="drain",
        old_channel=Channel(V1, ("kid-a",)),
        new_channel=Channel(V2, ("kid-a",), ORIGIN, "/hooks/v2/"),
        from_seq=7,
        jwks_url=JWKS_URL,
    )
    orphaned = parse_channel_notice(
        verified(notice_body(kind="channel-orphaned", new=None, from_seq=None))
    )
    assert orphaned.new_channel is None
    assert orphaned.from_seq is None
    assert orphaned.policy == "cutover"


@pytest.mark.parametrize(
    "body",
    [
        status_body(),
        b'{"task": {"id": "t"}}',
        b'{"statusUpdate": {"taskId": "t", "metadata": {"urn:other": {"notice": "x"}}}}',
        notice_body(kind="channel-renamed"),  # a future kind: an ordinary status update
    ],
)
def test_parse_channel_notice_is_none_for_other_deliveries(body):
    assert parse_channel_notice(verified(body)) is None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"rebindId": 5}, "rebindId"),
        ({"policy": ""}, "policy"),
        ({"oldChannel": {"keyIds": ["kid-a"]}}, "oldChannel.version"),
        ({"oldChannel": {"version": V1, "keyIds": "kid-a"}}, "oldChannel.keyIds"),
        ({"oldChannel": {"version": V1, "keyIds": [f"k{n}" for n in range(17)]}}, "keyIds"),
        ({"newChannel": {"version": V2, "keyIds": ["kid-a"]}}, "newChannel.origin"),
        ({"newChannel": None}, "newChannel"),
        ({"fromSeq": "7"}, "fromSeq"),
        ({"fromSeq": -1}, "fromSeq"),
        ({"fromSeq": True}, "fromSeq"),
        ({"jwksUrl": 3}, "jwksUrl"),
    ],
)
def test_parse_channel_notice_refuses_a_malformed_notice(overrides, field):
    payload = json.loads(notice_body())
    payload["statusUpdate"]["metadata"][PUSH_CHANNEL_EXTENSION_URI].update(overrides)
    with pytest.raises(VerificationError, match=field) as info:
        parse_channel_notice(verified(json.dumps(payload).encode()))
    assert info.value.reason == "payload"


def test_parse_channel_notice_refuses_a_changed_notice_without_from_seq():
    with pytest.raises(VerificationError, match="fromSeq"):
        parse_channel_notice(verified(notice_body(from_seq=None)))


def test_parse_channel_notice_refuses_extension_metadata_that_is_not_an_object():
    body = {"statusUpdate": {"taskId": TASK, "metadata": {PUSH_CHANNEL_EXTENSION_URI: "x"}}}
    with pytest.raises(VerificationError, match="object"):
        parse_channel_notice(verified(json.dumps(body).encode()))
