"""In-transaction extension points of the lifecycle services.

The webhooks app registers a hook here (in its AppConfig.ready) to write outbox rows in the
same transaction as the event, so `tasks` never imports `webhooks` (DESIGN.md, dependencies).
A hook is called with writes: each a task and its new events of one statement, in seq order
(an executor's answer is three), for every event but a task's first (written with the task:
nothing can have subscribed to it yet). A write's hooks run right after it, or, inside
`hooks_together()`, once for all the writes made there, when it ends (still inside the
caller's transaction).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.models import Task, TaskEvent

EventWrite = tuple["Task", "list[TaskEvent]"]
EventHook = Callable[[list[EventWrite]], None]
_event_hooks: list[EventHook] = []
_together = threading.local()  # the writes `hooks_together` collects on this thread, if any


def register_event_hook(hook: EventHook) -> None:
    if hook not in _event_hooks:
        _event_hooks.append(hook)


def run_event_hooks(task: Task, events: list[TaskEvent]) -> None:
    collected = getattr(_together, "writes", None)
    if collected is not None:
        collected.append((task, events))
        return
    _run([(task, events)])


@contextlib.contextmanager
def hooks_together() -> Iterator[None]:
    """Inside a transaction: the event hooks of the writes made within run once, for all of
    them, when it ends without an error (a batch of quick answers: one outbox statement
    for the batch). Each write's events are still written when it is made, and each task
    stays locked by its write until the transaction ends, so a hook run at the end sees
    what it would have seen right after each write. Not nested."""
    if getattr(_together, "writes", None) is not None:
        raise RuntimeError("hooks_together() is already open on this thread")
    _together.writes = writes = []
    try:
        yield
    finally:
        _together.writes = None
    if writes:
        _run(writes)


def _run(writes: list[EventWrite]) -> None:
    for hook in _event_hooks:
        hook(writes)
