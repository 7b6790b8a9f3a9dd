"""The leases of this process's runs, renewed by one thread for all of them.

A run's dispatch is claimed with a lease (A2A_DISPATCH_LEASE_SECONDS); the sweeper takes over
a dispatch whose lease lapsed. While a run goes on, `renewing(dispatch_id, worker)` keeps its
lease: a third of the way into it, the keeper renews it, with every other lease due by then
or soon after, in one statement per worker name. Most runs (an echo answer) end long before
that and cost a dictionary entry, not a thread: a thread started and joined per run was 7 %
of a Celery worker's samples while it drained a backlog of echo tasks (docs/decisions.md,
"Executor dispatch and leases").

A renewal the database refuses is tried again at the next interval on a fresh connection: a
restart must not let a lease lapse under a run that goes on. A lease found lost (swept, or the
task finished) is left alone: the run goes on, and its release will find it lost.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.db import connections

from a2a_platform.lib.reconnect import database_unreachable, fresh_connection
from tasks.dispatch import dispatch_renew

logger = logging.getLogger(__name__)


def _interval() -> float:
    return max(settings.A2A_DISPATCH_LEASE_SECONDS / 3, 0.5)


class LeaseKeeper:
    """The leases being renewed ({dispatch id: (worker, when to renew)}) and the thread
    renewing them, started on the first run."""

    def __init__(self) -> None:
        self._leases: dict[int, tuple[str, float]] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        # When the waiting keeper wakes next (inf: not before a new lease wakes it). A lease due
        # later wakes nobody: a thread woken per run cost what a thread per run did.
        self._until = math.inf

    @contextlib.contextmanager
    def renewing(self, dispatch_id: int, worker: str) -> Iterator[None]:
        """Keep the dispatch's lease while the block runs."""
        with self._changed:
            self._leases[dispatch_id] = (worker, time.monotonic() + _interval())
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="lease-keeper")
                self._thread.start()
            elif self._leases[dispatch_id][1] < self._until:
                self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._leases.pop(dispatch_id, None)

    def _loop(self) -> None:
        while True:
            with self._changed:
                due = self._wait_for_due()
            try:
                self._renew(due)
            finally:
                # Back to the pool: renewals are rare, a connection kept between them is not.
                # Never the end of the keeper: a close that fails leaves the next to retry.
                with contextlib.suppress(Exception):
                    connections.close_all()

    def _wait_for_due(self) -> dict[str, list[int]]:
        """Wait (the condition acquired) until some lease is due for renewal; those due (or due
        within half an interval), by worker, each moved to its next renewal time."""
        while True:
            now = time.monotonic()
            due: dict[str, list[int]] = {}
            # Those due soon come along: one statement for a batch's leases, renewed a
            # little early rather than each on its own.
            soon = now + _interval() / 2
            for dispatch_id, (worker, renew_at) in self._leases.items():
                if renew_at <= soon:
                    due.setdefault(worker, []).append(dispatch_id)
            if due:
                following = now + _interval()
                for ids in due.values():
                    for dispatch_id in ids:
                        self._leases[dispatch_id] = (self._leases[dispatch_id][0], following)
                return due
            self._until = min((at for _, at in self._leases.values()), default=math.inf)
            self._changed.wait(None if self._until == math.inf else self._until - now)

    def _renew(self, due: dict[str, list[int]]) -> None:
        for worker, ids in due.items():
            try:
                dispatch_renew(dispatch_ids=ids, worker=worker)
            except Exception as exc:
                if not database_unreachable(exc):
                    logger.exception("lease renewal failed", extra={"dispatch_ids": ids})
                    continue
                logger.warning(
                    "lease renewal refused by the database; trying again",
                    extra={"dispatch_ids": ids},
                )
                fresh_connection()


_keeper: LeaseKeeper | None = None
_keeper_pid = 0
_keeper_lock = threading.Lock()


def keeper() -> LeaseKeeper:
    """This process's keeper (a forked child, such as a prefork pool's, gets its own: the
    parent's thread does not survive the fork)."""
    global _keeper, _keeper_pid
    with _keeper_lock:
        if _keeper is None or _keeper_pid != os.getpid():
            _keeper, _keeper_pid = LeaseKeeper(), os.getpid()
        return _keeper
