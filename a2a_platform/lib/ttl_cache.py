"""A small per-process TTL cache for the protocol hot path (agents, keys, rendered cards).

Each cache is per process: an entry is at most `ttl` seconds old, so a change committed by
another process is seen here within that bound. The process that makes the change can drop
its own entries at once (`discard`/`clear`, called on commit by the cache's owner: see
`protocol/context.py` and `webhooks/delivery/claim_record.py`). Every cache is registered in
`_instances`, which the test suite empties between tests (tests/conftest.py), as Django clears
its own caches.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")

_instances: weakref.WeakSet[TTLCache] = weakref.WeakSet()


class TTLCache(Generic[V]):
    def __init__(self, ttl: Callable[[], float], max_entries: int = 10_000) -> None:
        self._ttl = ttl  # read at use: settings may change (tests)
        self._max = max_entries
        self._data: dict[Hashable, tuple[float, V]] = {}
        self._lock = threading.Lock()
        _instances.add(self)

    def get(self, key: Hashable) -> V | None:
        item = self._data.get(key)
        if item is None or item[0] < time.monotonic():
            return None
        return item[1]

    def put(self, key: Hashable, value: V) -> V:
        ttl = self._ttl()
        if ttl > 0:
            with self._lock:
                if len(self._data) >= self._max:
                    self._data.clear()
                self._data[key] = (time.monotonic() + ttl, value)
        return value

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
