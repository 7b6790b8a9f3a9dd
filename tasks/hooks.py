"""In-transaction extension points of the lifecycle services.

The webhooks app registers a hook here (in its AppConfig.ready) to write outbox rows in the
same transaction as the event, so `tasks` never imports `webhooks` (DESIGN.md, dependencies).
They run once per write of a task's new events (the events of one statement together, in
seq order: an executor's answer is three), for every event but a task's first (written with
the task: nothing can have subscribed to it yet).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.models import Task, TaskEvent

EventHook = Callable[["Task", "list[TaskEvent]"], None]
_event_hooks: list[EventHook] = []


def register_event_hook(hook: EventHook) -> None:
    if hook not in _event_hooks:
        _event_hooks.append(hook)


def run_event_hooks(task: Task, events: list[TaskEvent]) -> None:
    for hook in _event_hooks:
        hook(task, events)
