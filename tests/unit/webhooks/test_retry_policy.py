"""The retry decision (webhooks/delivery/retry_policy.py), without a database: which failures are
retried on which schedule, when each schedule runs out, Retry-After and jitter."""

from __future__ import annotations

import pytest

from webhooks.delivery.retry_policy import Dead, Retry, decide, jitter, max_tries

SCHEDULE = [10.0, 100.0]
AUTH_SCHEDULE = [60.0, 120.0]


def decision(
    status: int | None,
    *,
    error: str | None = None,
    attempts: int = 1,
    rejections: int = 0,
    retry_after: float | None = None,
) -> Retry | Dead:
    return decide(
        status=status,
        error_class=error,
        retry_after=retry_after,
        attempts=attempts,
        earlier_auth_rejections=rejections,
        schedule=SCHEDULE,
        auth_schedule=AUTH_SCHEDULE,
        spread=lambda seconds: seconds,  # no jitter: exact waits
    )


@pytest.mark.parametrize("status", [None, 500, 502, 503, 408, 429])
def test_decide_retries_network_errors_5xx_408_and_429_on_the_schedule(status):
    error = "timeout" if status is None else None
    assert decision(status, error=error, attempts=1) == Retry(10.0)
    assert decision(status, error=error, attempts=2) == Retry(100.0)
    assert decision(status, error=error, attempts=3) == Dead("exhausted")


@pytest.mark.parametrize("status", [300, 301, 302, 400, 404, 409, 410, 422])
def test_decide_dead_letters_other_4xx_and_3xx_at_once(status):
    assert decision(status) == Dead("final")


@pytest.mark.parametrize("error", ["ssrf", "request"])
def test_decide_dead_letters_an_unsafe_destination_or_unbuildable_request(error):
    assert decision(None, error=error) == Dead("final")


@pytest.mark.parametrize("status", [401, 403])
def test_decide_retries_auth_rejections_on_their_own_schedule(status):
    assert decision(status, attempts=1) == Retry(60.0)
    # Five earlier outage tries do not use up the auth schedule ...
    assert decision(status, attempts=7, rejections=1) == Retry(120.0)
    assert decision(status, attempts=8, rejections=2) == Dead("exhausted")


def test_decide_does_not_count_auth_rejections_against_the_outage_schedule():
    # Four tries, three of them rejected: the outage schedule has seen one failure before.
    assert decision(503, attempts=4, rejections=2) == Retry(100.0)
    assert decision(503, attempts=5, rejections=2) == Dead("exhausted")


def test_decide_waits_at_least_the_retry_after_capped_at_a_day():
    assert decision(503, retry_after=30.0) == Retry(30.0)
    assert decision(503, retry_after=1.0) == Retry(10.0)  # never sooner than the schedule
    assert decision(429, retry_after=10**9) == Retry(86400.0)


def test_decide_jitters_the_scheduled_wait_by_default():
    waits = {
        decide(
            status=503,
            error_class=None,
            retry_after=None,
            attempts=1,
            earlier_auth_rejections=0,
            schedule=[100.0],
            auth_schedule=[],
        ).wait
        for _ in range(50)
    }
    assert len(waits) > 1
    assert all(80.0 <= wait <= 120.0 for wait in waits)
    assert all(80.0 <= jitter(100.0) <= 120.0 for _ in range(50))


@pytest.mark.parametrize("waits", [0, 1, 2, 5, 8])
def test_max_tries_is_the_first_try_and_one_after_each_wait_of_the_schedule(waits):
    assert max_tries([60.0] * waits) == waits + 1


@pytest.mark.parametrize("waits", [0, 1, 2, 5])
@pytest.mark.parametrize("status", [503, 401])
def test_decide_dead_letters_exactly_the_try_that_reaches_max_tries(waits, status):
    # The admin's "attempt n of m" shows max_tries(); the record dead-letters by decide():
    # one number for both, on the outage schedule and on the auth schedule alike.
    schedule = [1.0] * waits
    auth = status == 401

    def after(tries: int) -> Retry | Dead:
        return decide(
            status=status,
            error_class=None,
            retry_after=None,
            attempts=tries,
            earlier_auth_rejections=tries - 1 if auth else 0,
            schedule=[] if auth else schedule,
            auth_schedule=schedule if auth else [],
            spread=lambda seconds: seconds,
        )

    last = max_tries(schedule)
    assert [after(tries) for tries in range(1, last)] == [Retry(1.0)] * (last - 1)
    assert after(last) == Dead("exhausted")


def test_retry_policy_imports_no_django():
    import subprocess
    import sys

    code = (
        "import sys; import webhooks.delivery.retry_policy; "
        "assert not [m for m in sys.modules if m.startswith('django')], 'django imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
