"""What the webhooks admin's pages share: times to the millisecond, JSON as a block, an
action's skipped deliveries in words."""

from __future__ import annotations

import collections
import json
from datetime import UTC

from django.utils.html import format_html


def exact_time(value) -> str:
    """A timestamp to the millisecond, in UTC (DESIGN.md "Conventions"): triage compares
    attempts seconds apart, which the admin's default "Dec. 1, 2026, 3:04 p.m." hides."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def exact_time_cell(value):
    """`exact_time` on two lines (date, then time) for a narrow list column."""
    if value is None:
        return "-"
    date, time, zone = exact_time(value).split(" ")
    return format_html('<span class="a2a-time">{}<br>{} {}</span>', date, time, zone)


def pretty(value) -> str:
    """JSON (a dict, or text that parses as JSON) indented in a wrapping <pre>; other text
    as is, wrapped too. Autoescaped."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return format_html('<pre class="a2a-pre">{}</pre>', value) if value else "-"
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=isinstance(value, dict))
    return format_html('<pre class="a2a-pre">{}</pre>', text)


def skipped_text(skipped) -> str:
    """The reasons an action left deliveries alone, counted: "2 delivered: only …"."""
    counts = collections.Counter(s.message for s in skipped)
    return "; ".join(f"{n} × {message}" for message, n in counts.items())
