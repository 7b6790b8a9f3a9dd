"""Reads of the webhooks app: what is due, push configs' current bindings, deliveries for
the operators' API. No writes here (webhooks/services.py, webhooks/delivery.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from django.db.models import QuerySet
from django.utils import timezone

from tasks.errors import TaskNotFound
from tasks.models import Task
from webhooks.models import CONFIG_ID, Delivery, PushBinding, PushConfig


def due_configs(limit: int = 1000) -> list[int]:
    """Configs whose head is due, longest-waiting first (each once: a config has one head;
    the rows queued behind a head that waits for its retry do not count): what is waiting
    for a pump. Configs parked on a paused endpoint are not due."""
    due = PushConfig.objects.filter(head_due_at__lte=timezone.now()).order_by("head_due_at", "id")
    return list(due.values_list("pk", flat=True)[:limit])


def current_bindings(task: Task) -> list[PushBinding]:
    """The current binding of each live push config of the task, by config id."""
    return list(
        PushBinding.objects.select_related("config")
        .filter(config__task=task, config__deleted_at__isnull=True, retired_at__isnull=True)
        .order_by("config_id")
    )


def current_binding(task: Task, config_id: str) -> PushBinding:
    """The current binding of one live config of the task. Raises TaskNotFound."""
    if not CONFIG_ID.fullmatch(config_id):  # never stored (a NUL would not even reach SQL)
        raise TaskNotFound(task.pk)
    binding = (
        PushBinding.objects.select_related("config")
        .filter(
            config__task=task,
            config__config_id=config_id,
            config__deleted_at__isnull=True,
            retired_at__isnull=True,
        )
        .first()
    )
    if binding is None:
        raise TaskNotFound(task.pk)  # the spec has no "config not found" error (§3.1.8)
    return binding


def delivery_list(
    *,
    state: str | None = None,
    task_id: uuid.UUID | None = None,
    agent_slug: str | None = None,
    endpoint_origin: str | None = None,
) -> QuerySet[Delivery]:
    """Deliveries, newest first, with what the API renders of each, filtered by what is
    given."""
    qs = Delivery.objects.select_related(
        "task__agent", "config", "binding", "binding__endpoint"
    ).order_by("-id")
    if state is not None:
        qs = qs.filter(state=state)
    if task_id is not None:
        qs = qs.filter(task_id=task_id)
    if agent_slug is not None:
        qs = qs.filter(task__agent__slug=agent_slug)
    if endpoint_origin is not None:
        qs = qs.filter(binding__endpoint__origin=endpoint_origin)
    return qs


def delivery_by_event_id(event_id: uuid.UUID) -> Delivery | None:
    """One delivery with its attempt timeline, or None."""
    return (
        Delivery.objects.select_related("task__agent", "config", "binding__endpoint")
        .prefetch_related("attempts_log")
        .filter(event_id=event_id)
        .first()
    )


def delivery_pks(event_ids: Iterable[uuid.UUID]) -> list[int]:
    """The pks of the deliveries with these event ids (unknown ids are left out)."""
    return list(Delivery.objects.filter(event_id__in=list(event_ids)).values_list("pk", flat=True))
