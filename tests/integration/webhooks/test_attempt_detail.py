"""Each attempt keeps its failure in words, not only its class (issue 16, delivery triage).

Real sends through webhooks/delivery/transport.py to receivers in this process (a closed port, a
hanging or failing HTTP receiver, an https receiver with an expired certificate, a name that
does not resolve), recorded by the real claim and record services through both outbox
stores: the attempt row's `error_detail` is what the admin's timeline shows. The URL's path
and query (which may carry a secret) and the request's credentials never appear in it.
"""

from __future__ import annotations

import socket

import pytest

from tests.deliveries import delivery_claim_head, delivery_record
from tests.factories import AgentFactory, task_create, user_message
from tests.integration.webhooks.test_transport import Receiver
from tests.tls import CertificateAuthority, TLSReceiver
from webhooks.delivery import outbox_store
from webhooks.delivery.transport import TransportResult, failure_detail, post
from webhooks.models import DeliveryAttempt
from webhooks.services import push_config_create

pytestmark = pytest.mark.usefixtures("fresh_transport")

SECRET = "s3cret-in-query"
TOKEN = "bearer-token-never-shown"


@pytest.fixture(params=["postgres", "orm"])
def store(request, settings):
    settings.A2A_STORE = request.param
    expected = {"postgres": outbox_store.PgOutboxStore, "orm": outbox_store.OrmOutboxStore}
    assert isinstance(outbox_store.get_outbox_store(), expected[request.param])
    return request.param


@pytest.fixture
def loopback(settings):
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture
def http_receiver():
    r = Receiver()
    r.thread.start()
    yield r
    r.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def send_and_record(url: str, settings) -> DeliveryAttempt:
    """A task with a push config at `url` (with a token), its snapshot delivery claimed,
    sent for real and recorded; the attempt row as stored."""
    settings.A2A_WEBHOOK_TIMEOUT_SECONDS = 1
    agent = AgentFactory(executor="external")
    task = task_create(agent=agent, owner="owner", message=user_message("hi"))
    push = push_config_create(task=task, config={"id": "c", "url": url, "token": TOKEN}).config
    claim = delivery_claim_head(config_pk=push.pk)
    assert claim is not None
    result = post(claim.url, claim.body, claim.headers, timeout=1)
    delivery_record(claim=claim, result=result)
    attempt = DeliveryAttempt.objects.get(pk=claim.attempt_pk)
    assert SECRET not in attempt.error_detail
    assert TOKEN not in attempt.error_detail
    return attempt


def test_attempt_detail_connection_refused(db, store, loopback, settings):
    attempt = send_and_record(f"http://127.0.0.1:{closed_port()}/hook?k={SECRET}", settings)
    assert attempt.error_class == "connect"
    assert attempt.error_detail.startswith("connection refused ("), attempt.error_detail


def test_attempt_detail_timed_out(db, store, loopback, settings, http_receiver):
    attempt = send_and_record(http_receiver.url(f"/hang?k={SECRET}"), settings)
    assert attempt.error_class == "timeout"
    assert attempt.error_detail == "timed out after 1 s"


def test_attempt_detail_http_status_from_the_receiver(db, store, loopback, settings, http_receiver):
    attempt = send_and_record(http_receiver.url(f"/fail?k={SECRET}"), settings)
    assert (attempt.status, attempt.error_class) == (500, "")
    assert attempt.error_detail == "HTTP 500 Internal Server Error from the receiver"


def test_attempt_detail_success_has_none(db, store, loopback, settings, http_receiver):
    attempt = send_and_record(http_receiver.url("/ok"), settings)
    assert (attempt.status, attempt.error_detail) == (200, "")


def test_attempt_detail_name_does_not_resolve(db, store, loopback, settings, fake_dns):
    fake_dns.answers["hooks.example.org"] = [["93.184.215.14"], []]  # registration, then gone
    attempt = send_and_record(f"https://hooks.example.org/hook?k={SECRET}", settings)
    assert attempt.error_class == "dns"
    assert attempt.error_detail == "name does not resolve (hooks.example.org does not resolve)"


def test_attempt_detail_expired_certificate(db, store, settings, fake_dns, tmp_path):
    ca = CertificateAuthority(tmp_path)
    settings.A2A_WEBHOOK_CA_BUNDLE = str(ca.cert_path)
    settings.A2A_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    fake_dns.answers["receiver.test"] = [["127.0.0.1"]]
    with TLSReceiver(ca.issue(tmp_path, dns=["receiver.test"], expired=True)) as receiver:
        attempt = send_and_record(receiver.url("receiver.test", f"/hook?k={SECRET}"), settings)
    assert attempt.error_class == "tls"
    assert attempt.error_detail.startswith("certificate has expired ("), attempt.error_detail


@pytest.mark.parametrize(
    ("status", "note", "detail"),
    [
        (503, None, "HTTP 503 Service Unavailable from the receiver"),
        (599, None, "HTTP 599 from the receiver"),
        (
            404,
            "response body: timeout",
            "HTTP 404 Not Found from the receiver; response body: timeout",
        ),
        (204, None, ""),
        (200, "response body: timeout", "response body: timeout"),
    ],
)
def test_failure_detail_of_an_answer(status, note, detail):
    result = TransportResult(
        status=status,
        headers={},
        body_excerpt="",
        duration_ms=1.0,
        error_class=None,
        retry_after=None,
        error_detail=note,
    )
    assert failure_detail(result) == detail
