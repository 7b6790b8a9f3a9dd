"""The console's one time format (docs/decisions.md, "The operator console: one time
format"): absolute UTC to the second with a relative hint, "23:44:46 UTC · 2 min ago", the
date in front when it is not today's (UTC), in a `<time datetime=…>` element whose title is
the full ISO instant. Every operator page shows a time through `when` (admin columns and
read-only fields through `ConsoleTimes`, templates through the `when` filter of
webhooks/templatetags/console.py); the live pages' scripts format their JSON's ISO times
the same way (webhooks/static/webhooks/console_common.js `when`: keep the two in step).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import models
from django.utils import timezone
from django.utils.html import format_html

EMPTY = "–"


def _as_datetime(value: datetime | str | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    return value


def relative(value: datetime, now: datetime) -> str:
    """ "2 min ago" or "in 3 h": one unit, rounded down, as a glance needs."""
    seconds = int((now - value).total_seconds())
    span = abs(seconds)
    if span < 60:
        amount = f"{span} s"
    elif span < 3600:
        amount = f"{span // 60} min"
    elif span < 48 * 3600:
        amount = f"{span // 3600} h"
    else:
        amount = f"{span // 86400} d"
    return f"{amount} ago" if seconds >= 0 else f"in {amount}"


def _absolute(at: datetime, now: datetime) -> str:
    at = at.astimezone(UTC)
    day = "" if at.date() == now.astimezone(UTC).date() else at.strftime("%Y-%m-%d ")
    return f"{day}{at:%H:%M:%S} UTC"


def when_text(value: datetime | str | None, *, now: datetime | None = None) -> str:
    """The format as plain text, for messages and titles: "23:44:46 UTC · 2 min ago"."""
    at = _as_datetime(value)
    if at is None:
        return EMPTY
    now = now or timezone.now()
    return f"{_absolute(at, now)} · {relative(at, now)}"


def when(value: datetime | str | None, *, now: datetime | None = None) -> str:
    """`when_text` in a `<time>` element (machine-readable instant, full ISO in its title);
    each half keeps a line, so a narrow column breaks it at its dot only."""
    at = _as_datetime(value)
    if at is None:
        return EMPTY
    now = now or timezone.now()
    iso = at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return format_html(
        '<time class="a2a-time" datetime="{}" title="{}"><span>{}</span> · <span>{}</span></time>',
        iso,
        iso,
        _absolute(at, now),
        relative(at, now),
    )


def time_column(field) -> Callable[[Any], str]:
    """A list column or read-only field showing the model DateTimeField `field` through
    `when`, labelled and sorted as the field."""

    def shown(obj) -> str:
        return when(getattr(obj, field.name))

    shown.__name__ = field.name  # the cell's CSS class, as the stock column's
    shown.short_description = field.verbose_name
    shown.admin_order_field = field.name
    return shown


class ConsoleTimes:
    """A ModelAdmin or inline mixin: every DateTimeField it lists or shows read-only goes
    through `when` (Django's stock rendering is "Dec. 6, 2026, 11:44 p.m." in list cells and
    read-only fields alike). Only the names are swapped, in the lists Django asks for, so
    each admin keeps naming its fields as usual; an editable datetime input is left alone."""

    def _time_columns(self) -> dict[str, Callable[[Any], str]]:
        columns = self.__dict__.get("_a2a_time_columns")
        if columns is None:
            columns = {
                f.name: time_column(f)
                for f in self.model._meta.get_fields()
                if isinstance(f, models.DateTimeField)
            }
            self._a2a_time_columns = columns
        return columns

    def _timed(self, names) -> list:
        columns = self._time_columns()
        return [columns.get(n, n) if isinstance(n, str) else n for n in names]

    def get_list_display(self, request):
        return self._timed(super().get_list_display(request))

    def get_readonly_fields(self, request, obj=None):
        return self._timed(super().get_readonly_fields(request, obj))

    def get_fields(self, request, obj=None):
        # A field the page shows read-only: a read-only one, a non-editable one (auto_now),
        # or any on a page its viewer may not change (Django then shows every field
        # read-only, by the names this returns).
        fields = super().get_fields(request, obj)
        columns = self._time_columns()
        readonly = set(self.get_readonly_fields(request, obj))
        changeable = self.has_change_permission(request, obj)
        editable = {f.name for f in self.model._meta.concrete_fields if f.editable}
        return [
            columns[name]
            if isinstance(name, str)
            and name in columns
            and (columns[name] in readonly or name not in editable or not changeable)
            else name
            for name in fields
        ]
