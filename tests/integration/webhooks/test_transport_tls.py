"""HTTPS delivery: webhooks.delivery.transport against a TLS receiver whose certificates a test CA
signs.

Production sends only https to public hosts, so this is the path every real delivery takes.
The in-process tests map `receiver.test` to 127.0.0.1 (`fake_dns`, conftest.py), allowlist
loopback, and trust the test CA through `A2A_WEBHOOK_CA_BUNDLE`, which the transport reads
when it makes a new connection (hence `close_client()` around each test and after each change
of the setting). The receiver (tests/tls.py) counts TCP connections and handshakes, records
the SNI name it was sent, and every request, so "refused" means no request reached it.

The slow tests at the end run the whole pipeline: a worker process delivers a task's events to
an https receiver process (tests/webhook_receiver.py --tls-cert/--tls-key) for `localhost`.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.deliveries import close_client
from tests.processes import wait_until
from tests.tls import RESPONSE_BODY, CertificateAuthority, TLSReceiver
from tests.webhook_checks import (
    ALLOWED,
    assert_delivered,
    configure,
    deliveries,
    open_task,
    start_worker,
    wait_all,
)
from tests.webhook_receiver import ReceiverProcess
from webhooks.delivery.transport import PostRequest, post, submit
from webhooks.models import DeliveryAttempt, DeliveryState

# A new connection pool per test: a kept-alive connection must not stand in for a new
# connect or handshake (conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_transport")

NAME = "receiver.test"
TIMEOUT = 5
# A path and query that must never show up in an error detail (the transport's promise).
SECRET_PATH = "/hook/secret-path?token=secret-query"
BODY = json.dumps({"statusUpdate": {"taskId": "t-1", "text": "héllo ✓"}}).encode() + b"\n"
HEADERS = {
    "Content-Type": "application/a2a+json",
    "Authorization": "Bearer abc.def",
    "webhook-id": "evt_123",
    "webhook-signature": "v1a,AAAA v1a,BBBB",
}


@pytest.fixture
def ca(tmp_path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path)


@pytest.fixture
def resolvable(settings, fake_dns):
    """`receiver.test` is 127.0.0.1, and loopback is allowlisted (the only way to reach a
    receiver in this process; production allowlists nothing)."""
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    fake_dns.answers[NAME] = [["127.0.0.1"]]
    return fake_dns


@pytest.fixture
def trusted(settings, ca, resolvable):
    """The test CA is the transport's trust store."""
    settings.A2A_WEBHOOK_CA_BUNDLE = str(ca.cert_path)
    return ca


@pytest.fixture
def receiver(ca, tmp_path, resolvable):
    """An https receiver for `receiver.test`, its certificate signed by the test CA."""
    with TLSReceiver(ca.issue(tmp_path, dns=[NAME])) as r:
        yield r


def assert_refused_in_handshake(receiver: TLSReceiver) -> None:
    """The transport reached the receiver and gave up in the handshake: no handshake
    completed and no request was read."""
    receiver.wait_for(lambda r: r.failed_handshakes and r.connections >= 1)
    assert receiver.handshakes == 0, receiver.summary()
    assert receiver.requests == [], receiver.summary()


def assert_nothing_reached(receiver: TLSReceiver) -> None:
    time.sleep(0.05)  # an accepted connection is counted on the server's thread
    assert receiver.connections == 0, receiver.summary()
    assert receiver.requests == [], receiver.summary()


# --- delivered ---------------------------------------------------------------------------


def test_https_post_is_delivered_with_the_test_ca_trusted(receiver, trusted):
    result = post(receiver.url(NAME, "/hook?task=t-1"), BODY, HEADERS, timeout=TIMEOUT)

    assert (result.error_class, result.error_detail) == (None, None)
    assert result.ok
    assert result.status == 200
    assert result.headers["x-receiver"] == "tls"
    assert result.body_excerpt == RESPONSE_BODY.decode()
    [got] = receiver.requests
    assert got.method == "POST"
    assert got.path == "/hook?task=t-1"
    assert got.body == BODY
    for name, value in HEADERS.items():
        assert got.header(name) == value
    assert got.header("Content-Length") == str(len(BODY))
    # The name, not the address it was connected to: virtual hosts work over TLS too.
    assert got.header("Host") == f"{NAME}:{receiver.port}"
    assert receiver.handshakes == 1


def test_tls_sni_is_the_host_name_not_the_address(receiver, trusted, resolvable):
    """The transport connects to the checked address (127.0.0.1) but the ClientHello names
    the host, so a receiver serving several names picks the right certificate."""
    result = post(receiver.url(NAME), BODY, HEADERS, timeout=TIMEOUT)

    assert result.ok, (result.error_class, result.error_detail)
    assert receiver.server_names == [NAME]
    assert NAME in resolvable.lookups  # resolved here, connected to the address


def test_an_ip_address_url_is_verified_against_the_certificates_ip_and_sends_no_sni(
    ca, tmp_path, trusted
):
    """https://127.0.0.1 (an allowlisted receiver without a name): the certificate must name
    the IP address; a ClientHello never carries an address as SNI (RFC 6066 §3)."""
    with TLSReceiver(ca.issue(tmp_path, ips=["127.0.0.1"])) as by_address:
        result = post(by_address.url("127.0.0.1"), BODY, HEADERS, timeout=TIMEOUT)

        assert result.ok, (result.error_class, result.error_detail)
        assert by_address.server_names == [None]
        [got] = by_address.requests
        assert got.header("Host") == f"127.0.0.1:{by_address.port}"


def test_keep_alive_over_tls_three_posts_one_connection_one_handshake(receiver, trusted):
    for n in range(3):
        result = post(receiver.url(NAME, f"/hook?n={n}"), BODY, HEADERS, timeout=TIMEOUT)
        assert result.ok, (n, result.error_class, result.error_detail)

    assert [r.path for r in receiver.requests] == ["/hook?n=0", "/hook?n=1", "/hook?n=2"]
    assert receiver.connections == 1, receiver.summary()
    assert receiver.handshakes == 1, receiver.summary()
    assert receiver.server_names == [NAME]


def test_submit_delivers_a_batch_over_https(receiver, trusted):
    """The pump's path: a batch on the sender loop, each request its own future."""
    requests = [
        PostRequest(receiver.url(NAME, f"/hook?n={n}"), BODY + str(n).encode(), HEADERS)
        for n in range(4)
    ]
    results = [future.result(timeout=TIMEOUT * 2) for future in submit(requests, TIMEOUT)]

    assert [(r.status, r.error_class) for r in results] == [(200, None)] * 4
    got = {r.path: r.body for r in receiver.requests}
    assert got == {f"/hook?n={n}": BODY + str(n).encode() for n in range(4)}
    # However many connections the batch opened, each completed one handshake naming the host.
    assert receiver.handshakes == receiver.connections
    assert set(receiver.server_names) == {NAME}


def test_the_ca_bundle_setting_is_read_for_each_new_connection(receiver, trusted, settings):
    """Cleared, the system trust store (which does not know the test CA) applies to the next
    connection; set again, the CA is trusted again: no trust decision is cached past
    `close_client()`."""
    assert post(receiver.url(NAME), BODY, HEADERS, timeout=TIMEOUT).ok

    settings.A2A_WEBHOOK_CA_BUNDLE = ""
    close_client()
    refused = post(receiver.url(NAME), BODY, HEADERS, timeout=TIMEOUT)
    assert refused.error_class == "tls", (refused.error_class, refused.error_detail)

    settings.A2A_WEBHOOK_CA_BUNDLE = str(trusted.cert_path)
    close_client()
    again = post(receiver.url(NAME), BODY, HEADERS, timeout=TIMEOUT)
    assert again.ok, (again.error_class, again.error_detail)
    assert len(receiver.requests) == 2


def test_a_ca_bundle_replaced_on_disk_is_trusted_from_the_next_connection(
    receiver, ca, tmp_path, settings, resolvable
):
    """A rotated bundle (a mounted file rewritten in place, same path) is read again for the
    next new connection: here it stops trusting the receiver's CA, then trusts it again."""
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(ca.cert_path.read_bytes())
    settings.A2A_WEBHOOK_CA_BUNDLE = str(bundle)
    assert post(receiver.url(NAME), BODY, HEADERS, timeout=TIMEOUT).ok

    other = CertificateAuthority(tmp_path, name="Another CA")
    bundle.write_bytes(other.cert_path.read_bytes())
    close_client()
    refused = post(receiver.url(NAME), BODY, HEADERS, timeout=TIMEOUT)
    assert refused.error_class == "tls", (refused.error_class, refused.error_detail)

    bundle.write_bytes(other.cert_path.read_bytes() + ca.cert_path.read_bytes())
    close_client()
    again = post(receiver.url(NAME), BODY, HEADERS, timeout=TIMEOUT)
    assert again.ok, (again.error_class, again.error_detail)


# --- refused in the handshake --------------------------------------------------------------


def _wrong_name(ca, second, tmp_path):
    return ca.issue(tmp_path, dns=["other.test"]), "hostname mismatch"


def _expired(ca, second, tmp_path):
    return ca.issue(tmp_path, dns=[NAME], expired=True), "certificate has expired"


def _untrusted_ca(ca, second, tmp_path):
    return second.issue(tmp_path, dns=[NAME]), "unable to get local issuer certificate"


@pytest.mark.parametrize(
    "make_leaf",
    [_wrong_name, _expired, _untrusted_ca],
    ids=["certificate-for-another-name", "expired-certificate", "certificate-from-untrusted-ca"],
)
def test_https_refuses_a_certificate_it_cannot_verify(make_leaf, ca, tmp_path, trusted):
    """Bundle = the test CA. A certificate for another name, an expired one, or one from a
    second CA: `tls`, the verification's reason in the detail, no request sent."""
    second = CertificateAuthority(tmp_path, "Untrusted CA")
    leaf, reason = make_leaf(ca, second, tmp_path)
    with TLSReceiver(leaf) as bad:
        result = post(bad.url(NAME, SECRET_PATH), BODY, HEADERS, timeout=TIMEOUT)

        assert result.error_class == "tls", (result.error_class, result.error_detail)
        assert result.status is None
        assert not result.ok
        assert reason in (result.error_detail or "").lower(), result.error_detail
        assert "secret" not in result.error_detail
        assert_refused_in_handshake(bad)


def test_https_with_no_bundle_uses_the_system_store_which_does_not_know_the_test_ca(
    receiver, settings
):
    settings.A2A_WEBHOOK_CA_BUNDLE = ""

    result = post(receiver.url(NAME, SECRET_PATH), BODY, HEADERS, timeout=TIMEOUT)

    assert result.error_class == "tls", (result.error_class, result.error_detail)
    assert result.status is None
    detail = (result.error_detail or "").lower()
    assert "unable to get local issuer certificate" in detail, result.error_detail
    assert "secret" not in detail
    assert_refused_in_handshake(receiver)


# --- a CA bundle that cannot be used -------------------------------------------------------


def _missing(tmp_path):
    return tmp_path / "no-such-bundle.pem"


def _not_pem(tmp_path):
    path = tmp_path / "not-a-bundle.pem"
    path.write_text("this is not a PEM certificate\n")
    return path


def _key_only(tmp_path):
    """A PEM file, but of a private key: no certificate to trust."""
    leaf = CertificateAuthority(tmp_path, "Other").issue(tmp_path, dns=[NAME])
    return leaf.key_path


@pytest.mark.parametrize(
    "make_bundle", [_missing, _not_pem, _key_only], ids=["missing", "not-pem", "no-certificate"]
)
def test_an_unusable_ca_bundle_refuses_https_naming_the_setting_and_sends_nothing(
    make_bundle, receiver, ca, settings, tmp_path
):
    """What a careful operator wants when A2A_WEBHOOK_CA_BUNDLE points at nothing usable:
    never a silent fall-back to the system store (that would trust what the operator meant
    to replace), never an exception out of the transport; each https send is `tls`, its
    detail names the setting and the path, and no connection is made. Fixed, the next send
    works (the failure is not cached)."""
    bundle = make_bundle(tmp_path)
    settings.A2A_WEBHOOK_CA_BUNDLE = str(bundle)

    result = post(receiver.url(NAME, SECRET_PATH), BODY, HEADERS, timeout=TIMEOUT)

    assert result.error_class == "tls", (result.error_class, result.error_detail)
    assert result.status is None
    assert "A2A_WEBHOOK_CA_BUNDLE" in (result.error_detail or ""), result.error_detail
    assert str(bundle) in result.error_detail
    assert "secret" not in result.error_detail
    assert_nothing_reached(receiver)

    settings.A2A_WEBHOOK_CA_BUNDLE = str(ca.cert_path)
    close_client()
    fixed = post(receiver.url(NAME), BODY, HEADERS, timeout=TIMEOUT)
    assert fixed.ok, (fixed.error_class, fixed.error_detail)


# --- the whole pipeline: a worker process, an https receiver process ------------------------

# `localhost` is what the worker resolves (its DNS cannot be faked); it may resolve to ::1 as
# well as 127.0.0.1, and every address must pass the SSRF check, so both are allowlisted. The
# receiver listens on 127.0.0.1 only: a transport that tries ::1 first must fall back.
LOCALHOST_NETWORKS = f"{ALLOWED},::1/128"
TOKEN = "notification-token-1"


@pytest.fixture
def tls_receiver(tmp_path, ca):
    receiver = ReceiverProcess(
        tmp_path,
        name="tls-receiver",
        tls=ca.issue(tmp_path, dns=["localhost"], label="localhost"),
    )
    receiver.start()
    yield receiver
    receiver.stop()
    records = [(r.n, r.header("x-a2a-task-seq"), r.answer) for r in receiver.records()]
    print(f"----- {receiver.name} records -----\n{records}")  # noqa: T201


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_worker_delivers_every_event_of_a_task_over_https(
    settings, procs, scripted_agent, tls_receiver, ca
):
    """A worker process trusting the test CA (A2A_WEBHOOK_CA_BUNDLE in its environment)
    delivers the snapshot and every event of a task to https://localhost:PORT/hook: each
    exactly once, in order, verified as a client verifies them, each a 200 over TLS."""
    configure(settings)
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = LOCALHOST_NETWORKS.split(",")
    assert tls_receiver.url.startswith("https://localhost:")
    start_worker(
        procs,
        A2A_WEBHOOK_CA_BUNDLE=str(ca.cert_path),
        A2A_WEBHOOK_ALLOWED_NETWORKS=LOCALHOST_NETWORKS,
    )

    _, (config,) = open_task(scripted_agent, "chunks 3", {"url": tls_receiver.url, "token": TOKEN})
    wait_all(config, timeout=30)

    records = assert_delivered(tls_receiver, config, scripted_agent, token=TOKEN)
    # submitted (snapshot), working, three chunks, the echo artifact, completed.
    assert [r.header("x-a2a-event-kind") for r in records] == [
        "snapshot", "status", "artifact", "artifact", "artifact", "artifact", "status",
    ]  # fmt: skip
    assert {r.header("host") for r in records} == {f"localhost:{tls_receiver.port}"}
    attempts = DeliveryAttempt.objects.filter(delivery__config=config)
    assert [(a.status, a.error_class) for a in attempts] == [(200, "")] * len(records)
    assert {a.url for a in attempts} == {tls_receiver.url}


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_worker_without_the_ca_bundle_refuses_the_receiver_in_the_handshake(
    settings, procs, scripted_agent, tls_receiver
):
    """The same receiver, a worker on the system trust store: the first try of the snapshot
    is a `tls` failure, left to retry, and the receiver never read a request."""
    configure(settings)
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = LOCALHOST_NETWORKS.split(",")
    start_worker(procs, A2A_WEBHOOK_CA_BUNDLE="", A2A_WEBHOOK_ALLOWED_NETWORKS=LOCALHOST_NETWORKS)

    _, (config,) = open_task(scripted_agent, "chunks 3", {"url": tls_receiver.url})
    # The attempt row is written when the try is claimed, its outcome when it was made.
    attempt = wait_until(
        lambda: DeliveryAttempt.objects.filter(
            delivery__config=config, duration_ms__isnull=False
        ).first(),
        timeout=30,
        message="the first try's outcome",
    )

    assert (attempt.status, attempt.error_class) == (None, "tls")
    head = deliveries(config)[0]
    assert head.kind == "snapshot"
    assert head.state != DeliveryState.DELIVERED
    assert head.last_error == "tls"
    assert tls_receiver.records() == []
