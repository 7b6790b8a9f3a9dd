"""Whether this process's event hub is connected: a flag the hub (tasks/event_hub.py) keeps
and readiness reads, here so that agents, below tasks, need not import the hub.

A plain set any thread may read (set add/discard are atomic): readiness runs in Django's
threads, the hubs in their event loops.
"""

from __future__ import annotations

# Ids of this process's connected hubs.
_connected_hubs: set[int] = set()


def hub_connected_set(hub_id: int, *, connected: bool) -> None:
    """Called by a hub when it connects or loses its connection."""
    if connected:
        _connected_hubs.add(hub_id)
    else:
        _connected_hubs.discard(hub_id)


def process_hub_connected() -> bool:
    """Whether an event hub of this process is connected (readable from any thread)."""
    return bool(_connected_hubs)
