"""Read-only views of the task store: tasks with their event timeline, history and artifacts."""

import json

from django.contrib import admin
from django.utils.html import format_html

from a2a_platform.lib.admin import ReadOnlyAdmin, ReadOnlyInline
from tasks.models import Artifact, ExecutorDispatch, Message, Task, TaskEvent
from tasks.selectors import task_orphaned_q


def _json_block(value) -> str:
    """A stored JSON value (an event's payload, a message's parts) indented, as sent."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', text)


class TaskEventInline(ReadOnlyInline):
    model = TaskEvent
    fields = ("seq", "kind", "created_at", "payload_shown")
    ordering = ("seq",)
    verbose_name_plural = "event timeline"

    @admin.display(description="payload")
    def payload_shown(self, obj: TaskEvent) -> str:
        return _json_block(obj.payload)


class MessageInline(ReadOnlyInline):
    model = Message
    fields = ("message_id", "role", "parts_shown", "created_at")

    @admin.display(description="parts")
    def parts_shown(self, obj: Message) -> str:
        return _json_block(obj.parts)


class ArtifactInline(ReadOnlyInline):
    model = Artifact
    fields = ("artifact_id", "name", "chunks", "complete", "parts_shown")

    @admin.display(description="parts")
    def parts_shown(self, obj: Artifact) -> str:
        return _json_block(obj.parts)


class DispatchInline(ReadOnlyInline):
    model = ExecutorDispatch
    fields = (
        "state",
        "not_before",
        "enqueues",
        "claims",
        "claimed_by",
        "lease_expires_at",
        "error",
    )


class OrphanedFilter(admin.SimpleListFilter):
    """Tasks a rebind's cutover orphaned (docs/rebinds.md): their push channel was cut over
    and no operator has re-bound it yet."""

    title = "push channel"
    parameter_name = "push_channel"

    def lookups(self, request, model_admin):
        return [("orphaned", "orphaned by a cutover")]

    def queryset(self, request, queryset):
        if self.value() == "orphaned":
            return queryset.filter(task_orphaned_q())
        return queryset


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent", "state", "status_timestamp", "context_id", "owner", "last_seq")
    list_filter = ("state", "agent", OrphanedFilter)
    search_fields = ("=id", "context_id")
    list_select_related = ("agent",)
    date_hierarchy = "status_timestamp"
    inlines = [TaskEventInline, MessageInline, ArtifactInline, DispatchInline]

    def get_search_results(self, request, queryset, search_term):
        # An exact id search with a malformed UUID would raise; match nothing instead.
        import uuid

        term = search_term.strip()
        try:
            uuid.UUID(term)
        except ValueError:
            return queryset.filter(context_id__icontains=term) if term else queryset, False
        return queryset.filter(id=term) | queryset.filter(context_id=term), False
