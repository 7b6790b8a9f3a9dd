"""The console's template filters: `{% load console %}`, then `{{ value|when }}` (a datetime
or an ISO string, a2a_platform/lib/times.py: the one time format) and `{{ name|words }}`
(an internal name an operator reads: `agents_worker` as "agents worker")."""

from django import template

from a2a_platform.lib import times

register = template.Library()


@register.filter
def when(value) -> str:
    return times.when(value)


@register.filter
def words(value) -> str:
    return str(value).replace("_", " ")
