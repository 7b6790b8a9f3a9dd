"""The served Agent Card is signed, and every distinct card served is a card version.

The card is fetched from the protocol app in process (the `wire` of tests/integration/protocol)
and checked the way a client checks it: parsed into the official `a2a_pb2.AgentCard` (unknown
fields ignored: the served JSON also carries the merged v0.3 top-level fields) and verified by
the official a2a-sdk helper with a key from the agent's published JWKS; and independently:
the RFC 8785 bytes of the card's v1.0 fields against the JWS signing input, with the Ed25519
public key from the JWKS (cryptography, no JOSE library).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import rfc8785
import time_machine
from a2a.types import a2a_pb2
from a2a.utils.signing import InvalidSignaturesError, create_signature_verifier
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from google.protobuf import json_format
from jwt.api_jwk import PyJWK

from a2a_platform.protocol import discovery, writes
from agents import readiness
from agents.card_signing import EmptyCardValue, sign_card
from agents.models import AuthMode, CardVersion, WorkerHeartbeat
from agents.signing import (
    active_signing_key,
    b64url_decode,
    b64url_encode,
    jwks,
)
from tasks.models import Task
from tests.factories import AgentFactory, user_message
from tests.integration.protocol.conftest import wire as protocol_wire  # noqa: F401 (fixture)

ORIGIN = "http://testserver"
SKILLS = [
    {
        "id": "summarize",
        "name": "Summarize",
        "description": "Summarizes a text",
        "tags": ["text", "summary"],
        "examples": ["Summarize this article"],
    },
    {
        "id": "translate",
        "name": "Translate",
        "description": "Translates a text — into French, Deutsch or 日本語",
        "tags": ["text", "i18n"],
    },
]


@pytest.fixture
def wire(protocol_wire, settings):  # noqa: F811 (pytest passes the imported fixture)
    """The protocol tests' in-process `wire`, readiness read afresh on every request (so a
    capability flip shows on the next card) and no served card reused from an earlier test."""
    settings.A2A_READINESS_CACHE_SECONDS = 0
    discovery._cards.clear()
    writes._card_versions.clear()
    yield protocol_wire
    discovery._cards.clear()
    writes._card_versions.clear()


@pytest.fixture
def agent(transactional_db):
    """An agent with its signing key, as agent_create makes one."""
    return AgentFactory(
        slug="signed",
        name="Signed Agent",
        description="An agent whose card is signed",
        version="2.1.0",
        executor="echo",
        skills=SKILLS,
        auth_mode=AuthMode.PUBLIC,
        provider_organization="Example Org",
        provider_url="https://example.org",
        documentation_url="https://example.org/docs",
    )


def card_path(agent) -> str:
    return f"/{agent.slug}/.well-known/agent-card.json"


def fetch_card(wire, agent, **headers):
    return wire.request("GET", card_path(agent), headers=headers)


def served(wire, agent) -> tuple[dict, str]:
    response = fetch_card(wire, agent)
    assert response.status_code == 200, response.text
    return response.json(), response.headers["etag"]


def parse(card: dict) -> a2a_pb2.AgentCard:
    """What a v1.0 client does with the served JSON."""
    return json_format.ParseDict(card, a2a_pb2.AgentCard(), ignore_unknown_fields=True)


def protected_header(card: dict) -> dict:
    return json.loads(b64url_decode(card["signatures"][0]["protected"]))


def published_jwks(wire, jku: str) -> dict:
    assert jku.startswith(ORIGIN)
    response = wire.request("GET", jku.removeprefix(ORIGIN))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/jwk-set+json")
    return response.json()


def sdk_verifier(wire) -> Callable[[a2a_pb2.AgentCard], None]:
    """The official a2a-sdk helper, its keys fetched from the JWKS the signature names."""

    def key_provider(kid: str | None, jku: str | None) -> PyJWK:
        assert kid
        assert jku
        keys = [k for k in published_jwks(wire, jku)["keys"] if k["kid"] == kid]
        assert len(keys) == 1, f"kid {kid} not published at {jku}"
        return PyJWK(keys[0])

    return create_signature_verifier(key_provider, ["EdDSA"])


def rfc8785_verify(card: a2a_pb2.AgentCard, jwks_doc: dict) -> None:
    """The independent check: RFC 8785 bytes of the v1.0 fields (signatures dropped) as the
    detached JWS payload, Ed25519 over `protected.payload`. Raises InvalidSignature."""
    fields = json_format.MessageToDict(card)
    signatures = fields.pop("signatures")
    assert len(signatures) == 1
    header = json.loads(b64url_decode(signatures[0]["protected"]))
    assert header["alg"] == "EdDSA"
    jwk = next(k for k in jwks_doc["keys"] if k["kid"] == header["kid"])
    assert (jwk["kty"], jwk["crv"]) == ("OKP", "Ed25519")
    public = Ed25519PublicKey.from_public_bytes(b64url_decode(jwk["x"]))
    signing_input = f"{signatures[0]['protected']}.{b64url_encode(rfc8785.dumps(fields))}"
    public.verify(b64url_decode(signatures[0]["signature"]), signing_input.encode("ascii"))


# --- the signature ----------------------------------------------------------------------------


def test_served_card_is_signed_and_both_verifiers_accept_it(wire, agent):
    card, _ = served(wire, agent)
    assert len(card["signatures"]) == 1
    header = protected_header(card)
    key = active_signing_key(agent)
    assert header == {
        "alg": "EdDSA",
        "kid": key.kid,
        "typ": "JOSE",
        "jku": f"{ORIGIN}/{agent.slug}/.well-known/jwks.json",
    }
    # The served JSON is the v1.0 card with the v0.3 fields merged in; both parse.
    assert card["url"] == f"{ORIGIN}/{agent.slug}/v0.3"
    proto = parse(card)
    assert proto.name == "Signed Agent"
    assert [s.id for s in proto.skills] == ["summarize", "translate"]
    assert proto.capabilities.push_notifications is True

    sdk_verifier(wire)(proto)  # raises when no signature verifies
    jwks_doc = published_jwks(wire, header["jku"])
    assert jwks_doc == jwks(agent)
    rfc8785_verify(proto, jwks_doc)


def test_the_signature_covers_exactly_the_v1_card_as_served(wire, agent):
    """What the v1.0 fields of the served JSON say is what was signed: re-serialising the
    served values (not a re-rendered card) gives the signed bytes."""
    card, _ = served(wire, agent)
    v1 = json_format.MessageToDict(parse(card))
    v1.pop("signatures")
    for key, value in v1.items():
        if key not in ("capabilities", "securitySchemes", "skills", "supportedInterfaces"):
            assert card[key] == value, key  # merged v0.3 fields never overwrite v1.0 ones
    assert card["capabilities"]["pushNotifications"] == v1["capabilities"]["pushNotifications"]
    assert [i["url"] for i in card["supportedInterfaces"]] == [
        i["url"] for i in v1["supportedInterfaces"]
    ]


TAMPERING: dict[str, Callable[[dict], None]] = {
    "name": lambda c: c.update(name="Signed Agent (evil twin)"),
    "description": lambda c: c.update(description="something else"),
    "a skill's description": lambda c: c["skills"][1].update(description="Exfiltrates a text"),
    "a skill removed": lambda c: c["skills"].pop(),
    "a skill's tag": lambda c: c["skills"][0]["tags"].append("admin"),
    "a capability": lambda c: c["capabilities"].update(
        streaming=not c["capabilities"]["streaming"]
    ),
    "push notifications": lambda c: c["capabilities"].update(pushNotifications=False),
    "an interface URL": lambda c: c["supportedInterfaces"][0].update(
        url="https://attacker.example/signed"
    ),
    "an interface binding": lambda c: c["supportedInterfaces"][1].update(protocolBinding="GRPC"),
    "the provider": lambda c: c["provider"].update(url="https://attacker.example"),
    "the version": lambda c: c.update(version="2.1.1"),
}


@pytest.mark.parametrize("field", list(TAMPERING))
def test_tampering_with_any_field_breaks_both_verifiers(wire, agent, field):
    card, _ = served(wire, agent)
    jwks_doc = published_jwks(wire, protected_header(card)["jku"])
    verify = sdk_verifier(wire)
    verify(parse(card))  # the untouched card verifies
    rfc8785_verify(parse(card), jwks_doc)

    tampered = copy.deepcopy(card)
    TAMPERING[field](tampered)
    proto = parse(tampered)
    assert proto != parse(card), "the tampering must reach the v1.0 card"
    with pytest.raises(InvalidSignaturesError):
        verify(proto)
    with pytest.raises(InvalidSignature):
        rfc8785_verify(proto, jwks_doc)


def test_a_signature_by_another_key_is_refused(wire, agent):
    """The signature is bound to the agent's key: another agent's JWKS does not verify it."""
    card, _ = served(wire, agent)
    other = AgentFactory(slug="other")
    with pytest.raises(InvalidSignature):
        rfc8785_verify(parse(card), {"keys": [{**jwks(other)["keys"][0], "kid": _kid(card)}]})
    verify = create_signature_verifier(lambda kid, jku: PyJWK(jwks(other)["keys"][0]), ["EdDSA"])
    with pytest.raises(InvalidSignaturesError):
        verify(parse(card))


def _kid(card: dict) -> str:
    return protected_header(card)["kid"]


# --- empty values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "card",
    [
        {"name": "x", "description": ""},
        {"name": "x", "skills": []},
        {"name": "x", "skills": [{"id": "s", "tags": []}]},
        {"name": "x", "capabilities": {"extensions": [{"uri": "urn:x", "params": {}}]}},
        {"name": "x", "provider": {}},
    ],
)
def test_sign_card_refuses_a_card_with_an_empty_value(agent, card):
    with pytest.raises(EmptyCardValue):
        sign_card(agent, card, jwks_url="https://example.org/jwks.json")


def test_an_agent_whose_card_would_carry_an_empty_value_is_not_served(wire, agent):
    """An operator-declared extension with an empty parameter survives the protobuf rendering
    (a Struct keeps it): the card is refused rather than signed with it, and nothing is
    recorded as served."""
    agent.extensions = [{"uri": "urn:example:ext", "params": {"region": ""}}]
    agent.save()
    response = fetch_card(wire, agent)
    assert response.status_code == 500
    assert "misconfigured" in response.text
    assert not CardVersion.objects.filter(agent=agent).exists()

    agent.extensions = [{"uri": "urn:example:ext", "params": {"region": "eu"}}]
    agent.save()
    card, _ = served(wire, agent)
    sdk_verifier(wire)(parse(card))


# --- card versions ----------------------------------------------------------------------------


def _make_delivery_worker_stale() -> None:
    WorkerHeartbeat.objects.update(beat_at=datetime(2000, 1, 1, tzinfo=UTC))


def _heartbeat() -> None:
    for hostname in WorkerHeartbeat.objects.values_list("hostname", flat=True):
        readiness.heartbeat(hostname=hostname)


def test_every_distinct_served_card_is_a_card_version_keyed_by_its_etag(wire, agent):
    card, etag = served(wire, agent)
    version = CardVersion.objects.get(agent=agent)
    assert version.content_hash.startswith(etag.strip('"'))
    assert version.card == card
    assert version.first_served_at == version.last_served_at

    # Served again: the same bytes, the same version; If-None-Match answers 304.
    again = fetch_card(wire, agent)
    assert again.json() == card
    assert again.headers["etag"] == etag
    assert fetch_card(wire, agent, **{"If-None-Match": etag}).status_code == 304
    assert CardVersion.objects.filter(agent=agent).count() == 1

    # The delivery worker is lost: pushNotifications flips (this instance was ready, the card
    # still answers 200), a new card, a new ETag, a new version.
    _make_delivery_worker_stale()
    flipped, flipped_etag = served(wire, agent)
    assert flipped["capabilities"]["pushNotifications"] is False
    assert card["capabilities"]["pushNotifications"] is True
    assert flipped_etag != etag
    assert fetch_card(wire, agent, **{"If-None-Match": etag}).status_code == 200
    sdk_verifier(wire)(parse(flipped))
    versions = {v.content_hash[:32]: v for v in CardVersion.objects.filter(agent=agent)}
    assert set(versions) == {etag.strip('"'), flipped_etag.strip('"')}
    assert versions[flipped_etag.strip('"')].card == flipped

    # It comes back: the first card again (same bytes, same ETag), no third version.
    _heartbeat()
    back, back_etag = served(wire, agent)
    assert (back, back_etag) == (card, etag)
    assert CardVersion.objects.filter(agent=agent).count() == 2


def test_last_served_at_is_written_at_most_once_a_minute(wire, agent):
    start = datetime(2026, 11, 12, 9, 0, tzinfo=UTC)

    def serve_at(moment: datetime) -> CardVersion:
        with time_machine.travel(moment, tick=False):
            _heartbeat()  # the worker stays live across the jumps
            discovery._cards.clear()  # this process's rendered-card cache (1 minute)
            served(wire, agent)
        return CardVersion.objects.get(agent=agent)

    version = serve_at(start)
    assert version.first_served_at == version.last_served_at == start
    assert serve_at(start + timedelta(seconds=30)).last_served_at == start
    assert serve_at(start + timedelta(seconds=59)).last_served_at == start
    version = serve_at(start + timedelta(seconds=61))
    assert version.last_served_at == start + timedelta(seconds=61)
    assert version.first_served_at == start
    assert serve_at(start + timedelta(seconds=90)).last_served_at == start + timedelta(seconds=61)
    assert CardVersion.objects.filter(agent=agent).count() == 1


def _open_task(wire, agent) -> Task:
    answer = wire.rpc(
        "SendMessage",
        {"message": user_message("hi"), "configuration": {"returnImmediately": True}},
        path=f"/{agent.slug}",
    )
    return Task.objects.get(pk=answer["result"]["task"]["id"])


def test_a_task_records_the_card_version_served_before_it_was_created(wire, agent):
    served(wire, agent)
    first = CardVersion.objects.get(agent=agent)
    assert _open_task(wire, agent).card_version_id == first.pk

    # After a capability flip the client saw the new card: a task opened now records it.
    _make_delivery_worker_stale()
    flipped, flipped_etag = served(wire, agent)
    assert flipped["capabilities"]["pushNotifications"] is False
    second = CardVersion.objects.get(agent=agent, content_hash__startswith=flipped_etag.strip('"'))
    assert _open_task(wire, agent).card_version_id == second.pk

    # And back.
    _heartbeat()
    served(wire, agent)
    assert _open_task(wire, agent).card_version_id == first.pk
