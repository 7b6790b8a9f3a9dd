"""What the webhooks admin's pages share: JSON as a block, an action's skipped deliveries in
words. Times go through a2a_platform/lib/times.py (`when`, `time_field`)."""

from __future__ import annotations

import collections
import json

from django.utils.html import format_html


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
