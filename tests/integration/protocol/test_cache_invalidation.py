"""In the process that makes a change, its own caches drop the entry when the change commits
(protocol/context.py, webhooks/delivery/headers.py): an operator who revokes a key, edits an
agent or rotates a signing key in a web process sees the effect there at once. Other processes
wait for their TTL (tests/integration/test_cache_bounds.py).

Each test first warms the cache through the production path and checks the entry is there,
so the effect seen after the change is the invalidation, not a cache miss.
"""

from __future__ import annotations

import hashlib

from a2a_platform.protocol import context, discovery
from agents.models import AuthMode, WorkerHeartbeat
from agents.services import agent_save, api_key_create, api_key_revoke
from agents.signing import active_signing_key, signing_key_retire, signing_key_rotate
from tests.factories import AgentFactory
from webhooks.delivery import headers as delivery_headers


def test_a_key_revoked_in_this_process_is_refused_here_at_once(wire):
    agent = AgentFactory(auth_mode=AuthMode.API_KEY)
    key = api_key_create(agent=agent, name="client")
    headers = {"Authorization": f"Bearer {key.token}"}
    path = f"/{agent.slug}/tasks"
    assert wire.request("GET", path, headers=headers).status_code == 200
    assert context._keys.get(hashlib.sha256(key.token.encode()).digest()) is not None

    api_key_revoke(key_id=key.key.pk, actor="test")

    assert wire.request("GET", path, headers=headers).status_code == 401


def test_an_agent_edited_in_this_process_is_served_here_at_once(wire):
    agent = AgentFactory(description="before the edit")
    card = f"/{agent.slug}/.well-known/agent-card.json"
    assert wire.request("GET", card).json()["description"] == "before the edit"
    assert context._agents.get(agent.slug) is not None

    agent.description = "after the edit"
    agent_save(agent=agent, actor="test")
    assert wire.request("GET", card).json()["description"] == "after the edit"

    agent.enabled = False
    agent_save(agent=agent, actor="test")
    assert wire.request("GET", card).status_code == 404


def test_signing_keys_changed_in_this_process_sign_here_at_once(transactional_db):
    agent = AgentFactory(signing_key=True)  # its first key, as agent_create writes it
    old = active_signing_key(agent)
    assert [kid for kid, _ in delivery_headers._signer(agent.pk).keys] == [old.kid]
    assert delivery_headers._signers.get(agent.pk) is not None

    new = signing_key_rotate(agent=agent)
    assert [kid for kid, _ in delivery_headers._signer(agent.pk).keys] == [new.kid, old.kid]

    signing_key_retire(key_id=old.pk, actor="test")
    assert [kid for kid, _ in delivery_headers._signer(agent.pk).keys] == [new.kid]


def test_a_card_served_again_is_chosen_anew_once_readiness_is_read_again(wire, settings):
    """The card endpoint keeps each agent's last served card beside what it was chosen from
    (discovery._cards, under ("served", agent id)) and serves it again while the agent's
    cached row and this instance's cached readiness are the same objects. A new readiness
    reading chooses again: here the delivery worker gone turns pushNotifications off."""
    settings.A2A_AGENT_CACHE_SECONDS = 60
    settings.A2A_READINESS_CACHE_SECONDS = 60
    agent = AgentFactory(push_notifications_enabled=True)
    card = f"/{agent.slug}/.well-known/agent-card.json"
    first = wire.request("GET", card)
    assert first.json()["capabilities"]["pushNotifications"] is True
    assert discovery._cards.get(("served", agent.pk)) is not None
    again = wire.request("GET", card)
    assert (again.headers["etag"], again.content) == (first.headers["etag"], first.content)

    WorkerHeartbeat.objects.all().delete()  # no live worker on any queue
    assert wire.request("GET", card).headers["etag"] == first.headers["etag"]  # still cached
    settings.A2A_READINESS_CACHE_SECONDS = 0  # every request reads readiness afresh

    after = wire.request("GET", card)
    assert after.status_code == 200  # ready once: the card stays up, its capability flips
    assert after.json()["capabilities"]["pushNotifications"] is False
    assert after.headers["etag"] != first.headers["etag"]
