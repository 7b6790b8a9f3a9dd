"""A change made in one process reaches the others within their cache TTL (the documented
bound), through the production cached path.

The web process (tests.live: uvicorn) caches the agent each tenant resolves to
(A2A_AGENT_CACHE_SECONDS) and each presented API key (A2A_API_KEY_CACHE_SECONDS); a worker
caches each agent's signing keys (A2A_SIGNING_KEY_CACHE_SECONDS). Here this test process makes
the change in the database (through the services the admin uses) while a real web or worker
process serves from its warm cache; the other process is then observed over HTTP (its
answers) or through a receiver process (the signatures on the deliveries it sends).

Right after the change, the other process may still answer from its cache: that is allowed
and only counted. What is checked is the bound: every request sent (every event written) later
than the change plus the TTL (the env value the child runs with) plus SLACK_SECONDS answers
with the new behaviour. Breaking the caches' expiry (a2a_platform/lib/ttl_cache.py) makes each
test fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from agents.models import AuthMode
from agents.services import agent_save, api_key_create, api_key_revoke
from agents.signing import active_signing_key, public_jwk, signing_key_retire, signing_key_rotate
from tasks import services
from tasks.states import TaskState
from tests import live
from tests.factories import AgentFactory
from tests.readiness_helpers import mark_workers_live
from tests.webhook_checks import open_task, start_worker
from tests.webhook_receiver import Record
from webhooks.receiver import WebhookVerifier

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The children's TTLs (env): the production default for agents (2 s), shortened from 5 s for
# API keys and signing keys to keep the tests quick. The bound checked is these values.
AGENT_TTL = 2.0
API_KEY_TTL = 2.0
SIGNING_KEY_TTL = 2.0
# Beyond the TTL: one poll interval, one in-flight request or delivery, and a loaded machine.
SLACK_SECONDS = 1.0
POLL_SECONDS = 0.05


@dataclass
class Observed:
    """What the other process answered after a change, by when each request was sent."""

    changed_at: float  # monotonic, taken just before the change was committed
    bound: float
    answers: list[tuple[float, bool]] = field(default_factory=list)  # (sent at, is new)

    @property
    def stale(self) -> int:
        """Answers from the cache after the change (allowed within the bound)."""
        return sum(1 for _, new in self.answers if not new)

    def stale_past_the_bound(self) -> list[float]:
        return [
            round(at - self.changed_at, 3)
            for at, new in self.answers
            if not new and at > self.changed_at + self.bound
        ]


def observe(is_new: Callable[[], bool], *, changed_at: float, ttl: float) -> Observed:
    """Poll `is_new` (one request to the other process) until it has answered with the new
    behaviour a few times in a row, for at most the bound plus slack (and a little more, so a
    stale answer past the bound is seen rather than cut off)."""
    seen = Observed(changed_at=changed_at, bound=ttl + SLACK_SECONDS)
    deadline = changed_at + ttl + SLACK_SECONDS + 1.0
    in_a_row = 0
    while in_a_row < 3 and time.monotonic() < deadline:
        sent_at = time.monotonic()
        new = is_new()
        seen.answers.append((sent_at, new))
        in_a_row = in_a_row + 1 if new else 0
        time.sleep(POLL_SECONDS)
    return seen


def assert_within_bound(seen: Observed, what: str) -> None:
    late = seen.stale_past_the_bound()
    assert not late, (
        f"{what}: the old behaviour was still served {late} s after the change "
        f"(bound {seen.bound} s = TTL + {SLACK_SECONDS} s slack)"
    )
    assert seen.answers[-1][1], (
        f"{what}: never took effect within {seen.bound} s ({len(seen.answers)} answers)"
    )


@pytest.fixture
def web(tmp_path):
    """A real web process with the production caches (the TTLs above)."""
    proc = live.start_web(
        tmp_path,
        A2A_AGENT_CACHE_SECONDS=str(AGENT_TTL),
        A2A_API_KEY_CACHE_SECONDS=str(API_KEY_TTL),
        A2A_SHUTDOWN_GRACE_SECONDS="0",
        A2A_ORM_THREADS="2",
    )
    yield proc
    proc.stop()
    print(f"----- web log (tail) -----\n{proc.log()[-4000:]}")  # noqa: T201


def test_a_revoked_api_key_is_refused_by_another_web_process_within_the_key_cache_ttl(web):
    agent = AgentFactory(auth_mode=AuthMode.API_KEY)
    new_key = api_key_create(agent=agent, name="client")
    url = f"{web.url}/{agent.slug}/tasks"
    headers = {"Authorization": f"Bearer {new_key.token}", "A2A-Version": "1.0"}

    def list_tasks() -> int:
        return httpx.get(url, headers=headers, timeout=5).status_code

    # Accepted, and now in the web process's key cache (each request reads it first).
    assert [list_tasks() for _ in range(3)] == [200, 200, 200]

    changed_at = time.monotonic()
    api_key_revoke(key_id=new_key.key.pk, actor="test")
    seen = observe(lambda: list_tasks() == 401, changed_at=changed_at, ttl=API_KEY_TTL)

    assert_within_bound(seen, "revoked API key")
    assert list_tasks() == 401
    print(f"answered from the cache after the revocation: {seen.stale}")  # noqa: T201


@pytest.mark.parametrize("change", ["description", "disabled"])
def test_an_agent_change_reaches_another_web_process_within_the_agent_cache_ttl(web, change):
    """An operator edits an agent (agent_save, as the admin does): its card says the new
    description, or, disabled, it is no longer served (ListTasks and the card: 404)."""
    mark_workers_live()  # the card is served once the web process's readiness passed
    agent = AgentFactory(description="before the edit")
    card_url = f"{web.url}/{agent.slug}/.well-known/agent-card.json"

    def card() -> httpx.Response:
        return httpx.get(card_url, timeout=5)

    def tasks_status() -> int:
        # Anonymous callers list the tasks of a contextId they name.
        url = f"{web.url}/{agent.slug}/tasks?contextId=ctx-1"
        return httpx.get(url, timeout=5).status_code

    # Served, and now in the web process's agent cache.
    live.wait_serving(web, card_url, lambda r: r.json()["description"] == "before the edit")
    assert tasks_status() == 200

    if change == "description":
        agent.description = "after the edit"

        def is_new() -> bool:
            response = card()
            assert response.status_code == 200, response.text
            return response.json()["description"] == "after the edit"
    else:
        agent.enabled = False

        def is_new() -> bool:
            return tasks_status() == 404

    changed_at = time.monotonic()
    agent_save(agent=agent, actor="test")
    seen = observe(is_new, changed_at=changed_at, ttl=AGENT_TTL)

    assert_within_bound(seen, f"agent {change}")
    if change == "disabled":
        assert card().status_code == 404
    print(f"answered from the cache after the edit: {seen.stale}")  # noqa: T201


def key_ids(record: Record) -> list[str]:
    return record.header("x-a2a-signature-key-ids").split()


def test_a_rotated_then_retired_signing_key_signs_a_workers_deliveries_within_the_ttl(
    procs, receivers, loopback_receivers
):
    """A worker signs with its cached keys: after a rotation, every event written later than
    the TTL is delivered signed by both keys (new first); after the retirement, by the new key
    only. Each signature is checked against the public key its hint names."""
    agent = AgentFactory(executor="external")  # this test moves its task
    old = active_signing_key(agent)
    receiver = receivers.start()
    start_worker(procs, A2A_SIGNING_KEY_CACHE_SECONDS=str(SIGNING_KEY_TTL))
    task, (config,) = open_task(agent, "hello", {"url": receiver.url})
    # The snapshot: signed by the old key, which the worker now holds in its cache.
    (snapshot,) = receiver.wait_for(lambda rs: len(rs) == 1, timeout=20, message="the snapshot")
    assert key_ids(snapshot) == [old.kid]
    services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
    receiver.wait_for(lambda rs: len(rs) == 2, timeout=20, message="the first status")

    def deliver_one() -> Record:
        """Write one event (a WORKING progress update) and wait for its delivery."""
        count = len(receiver.records())
        services.task_transition(task_id=task.pk, to_state=TaskState.WORKING)
        return receiver.wait_for(lambda rs: len(rs) > count, timeout=20)[count]

    def verified_by(record: Record, *keys) -> list[str]:
        """The key each signature entry verifies with (by its own key, one at a time)."""
        by = []
        for key in keys:
            verifier = WebhookVerifier(jwks={"keys": [public_jwk(key)]})
            by.append(verifier.verify(record.headers, record.body).key_id)
        return by

    new = None

    def rotated() -> bool:
        record = deliver_one()
        if key_ids(record) == [old.kid]:
            return False
        assert key_ids(record) == [new.kid, old.kid], key_ids(record)
        assert verified_by(record, new, old) == [new.kid, old.kid]
        return True

    changed_at = time.monotonic()
    new = signing_key_rotate(agent=agent)
    seen = observe(rotated, changed_at=changed_at, ttl=SIGNING_KEY_TTL)
    assert_within_bound(seen, "rotated signing key")

    def retired() -> bool:
        record = deliver_one()
        if key_ids(record) == [new.kid, old.kid]:
            return False
        assert key_ids(record) == [new.kid], key_ids(record)
        assert verified_by(record, new) == [new.kid]
        return True

    changed_at = time.monotonic()
    signing_key_retire(key_id=old.pk, actor="test")
    seen_retired = observe(retired, changed_at=changed_at, ttl=SIGNING_KEY_TTL)
    assert_within_bound(seen_retired, "retired signing key")
    print(  # noqa: T201
        f"signed from the cache: {seen.stale} after the rotation, "
        f"{seen_retired.stale} after the retirement"
    )
