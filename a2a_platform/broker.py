"""The Redis broker transport, hardened so a Celery worker survives a Redis restart.

When Redis goes away while the worker's consumer waits on BRPOP, Celery closes the broken
connection twice (once to collect it, once to release it). kombu's Redis channel reads the
pending BRPOP reply before marking itself closed; that read fails on the dead socket, the
first close stops half-way, and the second close then runs after the transport was detached
and raises AttributeError. Celery does not count that as a connection error, so the worker
stops with "Unrecoverable error" instead of reconnecting (reproduced by
tests/fault/webhooks/test_delivery_faults.py::test_redis_restarted_mid_run_everything_is_delivered).

Here a failed read of the pending reply is what it is, a dead connection: the close goes on,
so the channel is closed once, fully, and the consumer reconnects. Nothing of the message
flow changes: every job's truth is in the database and the sweepers re-enqueue what the
restart lost.

A publish also reuses the channel's client. kombu builds a new `redis.Redis` for every
publish (its constructor fills ~170 response callbacks), a third of a job publish's CPU on
the SendMessage path (docs/decisions.md, "Web and worker processes"). A redis-py client is
safe to share between threads (each command borrows a connection from the channel's pool),
so one per channel serves every publish until the channel closes.
"""

from contextlib import contextmanager
from queue import Empty

from kombu.transport import redis


class Channel(redis.Channel):
    _shared_client = None

    @contextmanager
    def conn_or_acquire(self, client=None):
        if client is None:
            if self._shared_client is None:
                self._shared_client = self._create_client()
            client = self._shared_client
        yield client

    def close(self):
        self._shared_client = None
        if self._in_poll:
            try:
                self._brpop_read()
            except (Empty, *self.connection_errors):
                # The reply can never come: the connection died with the broker.
                pass
        super().close()


class Transport(redis.Transport):
    Channel = Channel
