"""Short ORM calls from async code that give their database connection back at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

T = TypeVar("T")


def _returning_connection(fn: Callable[[], T]) -> Callable[[], T]:
    def call() -> T:
        try:
            return fn()
        finally:
            # With Django's pool this returns the connection to the pool; the executor thread
            # keeps nothing between calls, so an idle waiter holds no connection.
            connections.close_all()

    return call


async def run_orm(fn: Callable[[], T]) -> T:
    return await sync_to_async(_returning_connection(fn), thread_sensitive=False)()
