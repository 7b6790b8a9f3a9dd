"""One receiver failing does not hold up another's deliveries.

A flaky receiver answers 500, then 429 with `Retry-After: 3`, then accepts; meanwhile tasks
whose config points at a second, healthy receiver produce their events. Those arrive once
each and in order, all before the flaky receiver's head is accepted (at least Retry-After
after the 429, so none waited behind it); the flaky one still gets everything, in order,
after its retries. Real worker and receiver processes, the fault tests' timings
(tests/fault/webhooks/test_delivery_faults.py: retries after ~1 s).
"""

from __future__ import annotations

import pytest

from tests.fault.webhooks.test_delivery_faults import attempts_of, worker
from tests.webhook_checks import (
    accepted,
    assert_delivered,
    deliveries,
    open_task,
    wait_all,
)
from webhooks.models import Alert, Endpoint

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("loopback_receivers"),
]

RETRY_AFTER = 3


def test_a_receiver_answering_500_then_429_does_not_delay_another_receiver(
    scripted_agent, procs, receivers
):
    script = [{"status": 500}, {"status": 429, "retry_after": RETRY_AFTER}, {"status": 200}]
    flaky = receivers.start("flaky", sequence=script)
    healthy = receivers.start("healthy")
    worker(procs)

    _, (failing,) = open_task(scripted_agent, "chunks 3", {"url": flaky.url})
    flaky.wait_for(lambda rs: len(rs) >= 1, timeout=15, message="the 500")
    # While the flaky receiver's head waits for its retry...
    _, (first,) = open_task(scripted_agent, "chunks 3", {"url": healthy.url})
    flaky.wait_for(lambda rs: len(rs) >= 2, timeout=15, message="the 429")
    # ...and while it waits out Retry-After.
    _, (second,) = open_task(scripted_agent, "chunks 3", {"url": healthy.url})
    for config in (first, second, failing):
        wait_all(config, timeout=30)

    head = deliveries(failing)[0]
    tries = [r for r in flaky.records() if r.webhook_id == str(head.event_id)]
    assert [r.answer for r in tries] == script
    assert attempts_of(head) == [(500, ""), (429, ""), (200, "")]
    assert tries[2].at - tries[1].at >= RETRY_AFTER - 0.1  # Retry-After honoured
    assert_delivered(flaky, failing, scripted_agent, exactly_once=False)

    head_accepted_at = next(r.at for r in tries if accepted(r))
    for config in (first, second):
        records = assert_delivered(healthy, config, scripted_agent)  # once each, in order
        assert all(r.at < head_accepted_at for r in records)
        assert all(attempts_of(d) == [(200, "")] for d in deliveries(config))
    assert Endpoint.objects.get(origin=healthy.origin).consecutive_failures == 0
    assert not Alert.objects.filter(endpoint__origin=healthy.origin).exists()
