"""A small per-process TTL cache for the protocol hot path (agents, keys, rendered cards)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class TTLCache(Generic[V]):
    def __init__(self, ttl: Callable[[], float], max_entries: int = 10_000) -> None:
        self._ttl = ttl  # read at use: settings may change (tests)
        self._max = max_entries
        self._data: dict[Hashable, tuple[float, V]] = {}
        self._lock = threading.Lock()

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

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
