"""The per-process async event hub: one listener, many in-process waiters.

On PostgreSQL one LISTEN connection (psycopg async, autocommit) receives the NOTIFY every
lifecycle transaction sends at commit (payload: task id) and wakes the asyncio waiters of that
task. On SQLite (embedded mode) a poller reads new TaskEvent ids instead. Waiters hold no
database connection while they wait: they register first, then read the task's last seq in a
short ORM call, then await — so no event committed in between is missed.

The hub is per event loop (one per web process under uvicorn). `connected` feeds readiness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TypeVar

from django.conf import settings
from django.db import connections

from a2a_platform.lib.orm import run_orm
from agents.hub_state import hub_connected_set
from tasks.notify import CHANNEL

logger = logging.getLogger(__name__)

RECONNECT_DELAY_SECONDS = 1.0

T = TypeVar("T")


class EventHub:
    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Future]] = defaultdict(set)
        self._runner: asyncio.Task | None = None
        self._connected = asyncio.Event()
        self.backend = "postgresql" if _db_vendor() == "postgresql" else "polling"
        self.notifications = 0
        # Bumped by every wake-up and every (re)connection: a read of the store begun at
        # generation g has seen every event whose wake-up arrived before it, so waiters armed
        # at generation <= g may share it (protocol/streams.py).
        self.generation = 0

    # --- public ----------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self, timeout: float = 5.0) -> bool:
        """Start listening (idempotent); True once connected."""
        if self._runner is None or self._runner.done():
            self._runner = asyncio.get_running_loop().create_task(self._run(), name="event-hub")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), timeout)
        return self.connected

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner
        self._mark_connected(False)
        self._wake_all()

    def subscribe(self, task_id: object) -> asyncio.Future:
        """Register interest before reading the store; await the future or `unsubscribe`."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters[str(task_id)].add(fut)
        return fut

    def unsubscribe(self, task_id: object, fut: asyncio.Future) -> None:
        key = str(task_id)
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(fut)
            if not waiters:
                del self._waiters[key]
        if not fut.done():
            fut.cancel()

    async def wait_for_task_event(self, task_id: object, after_seq: int, timeout: float) -> bool:
        """True once the task may have an event with seq > after_seq; False on timeout.

        A True can be spurious (a reconnect wakes everyone): callers re-read after their
        cursor and wait again.
        """
        from tasks.selectors import last_seq

        await self.start()
        fut = self.subscribe(task_id)
        try:
            latest = await run_orm(lambda: last_seq(task_id))
            if latest is None or latest > after_seq:
                return True
            try:
                await asyncio.wait_for(asyncio.shield(fut), timeout)
            except TimeoutError:
                return False
            return True
        finally:
            self.unsubscribe(task_id, fut)

    async def read_then_wait(
        self,
        task_id: object,
        read: Callable[[], Awaitable[T]],
        *,
        enough: Callable[[T], bool],
        timeout: float,
    ) -> T:
        """Subscribe to the task, then await `read()` (a store read); unless `enough(value)`,
        wait up to `timeout` for the task's next wake-up. Returns the value read. One store
        read per wake-up: registered before the read, the waiter misses no event committed
        after it (the caller reads again after a wake-up, which may be spurious)."""
        await self.start()
        fut = self.subscribe(task_id)
        try:
            value = await read()
            if not enough(value) and timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(fut), timeout)
            return value
        finally:
            self.unsubscribe(task_id, fut)

    # --- internals -------------------------------------------------------------------------
    def _mark_connected(self, connected: bool) -> None:
        self.generation += 1
        # The event for waiters in this loop; the process-wide flag (agents/hub_state.py)
        # for readers in other threads (/readyz runs in Django's thread pool).
        if connected:
            self._connected.set()
        else:
            self._connected.clear()
        hub_connected_set(id(self), connected=connected)

    def _wake(self, task_id: str) -> None:
        self.notifications += 1
        self.generation += 1
        for fut in self._waiters.pop(task_id, ()):
            if not fut.done():
                fut.set_result(True)

    def _wake_all(self) -> None:
        for key in list(self._waiters):
            self._wake(key)

    async def _run(self) -> None:
        while True:
            try:
                if self.backend == "postgresql":
                    await self._listen()
                else:
                    await self._poll()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("event hub lost its connection; reconnecting", exc_info=True)
            self._mark_connected(False)
            # Anything may have happened while disconnected: let every waiter re-read.
            self._wake_all()
            await asyncio.sleep(RECONNECT_DELAY_SECONDS)

    async def _listen(self) -> None:
        import psycopg

        conninfo = _pg_conninfo()
        async with await psycopg.AsyncConnection.connect(autocommit=True, **conninfo) as conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            self._mark_connected(True)
            self._wake_all()
            logger.info("event hub listening", extra={"channel": CHANNEL})
            async for note in conn.notifies():
                self._wake(note.payload)

    async def _poll(self) -> None:
        from tasks.models import TaskEvent

        def newest() -> int:
            return TaskEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0

        def since(last: int) -> list[tuple[int, str]]:
            rows = (
                TaskEvent.objects.filter(id__gt=last)
                .order_by("id")
                .values_list("id", "task_id")[:1000]
            )
            return [(i, str(t)) for i, t in rows]

        last = await run_orm(newest)
        self._mark_connected(True)
        interval = settings.A2A_EVENT_HUB_POLL_SECONDS
        while True:
            await asyncio.sleep(interval)
            rows = await run_orm(lambda last=last: since(last))
            for event_id, task_id in rows:
                last = max(last, event_id)
                self._wake(task_id)


def _db_vendor() -> str:
    return connections["default"].vendor


def _pg_conninfo() -> dict:
    """The LISTEN connection's parameters: the ones Django's own connections use (NAME, USER,
    PASSWORD, HOST, PORT and every libpq option of OPTIONS: a socket directory, sslmode and
    its certificates, a service, application_name), without the three that only a
    synchronous psycopg connection takes (Django's cursor class, its adapters and its
    prepare threshold)."""
    params = connections["default"].get_connection_params()
    for sync_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(sync_only, None)
    return params


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventHub] = weakref.WeakKeyDictionary()


def get_hub() -> EventHub:
    """The hub of the running event loop (one per web process)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = EventHub()
    return hub


async def wait_for_task_event(task_id: object, after_seq: int, timeout: float) -> bool:
    return await get_hub().wait_for_task_event(task_id, after_seq, timeout)
