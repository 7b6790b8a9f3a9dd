"""Filtering and ordering helpers: django-filter FilterSets (a bad value is a 400 naming the
filter) and `?ordering=` limited to each view's `ordering_fields` (anything else is a 400)."""

from __future__ import annotations

import datetime as dt

import django_filters
from django.core.exceptions import ValidationError
from rest_framework.filters import OrderingFilter

from a2a_platform.api.errors import invalid


class WhitelistedOrdering(OrderingFilter):
    """`?ordering=a,-b` over the view's `ordering_fields` only; another field is refused."""

    def get_ordering(self, request, queryset, view):
        params = request.query_params.get(self.ordering_param)
        if params:
            fields = [param.strip() for param in params.split(",") if param.strip()]
            allowed = set(getattr(view, "ordering_fields", None) or [])
            bad = [f for f in fields if f.lstrip("-") not in allowed]
            if bad or not fields:
                raise invalid(
                    self.ordering_param,
                    f"order by {', '.join(sorted(allowed)) or 'nothing'} (prefix - to reverse)",
                )
            # A unique last key keeps cursor pages stable under ties.
            return fields
        return self.get_default_ordering(view)


class UtcIsoDateTimeField(django_filters.fields.IsoDateTimeField):
    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(dt.UTC)
        except OverflowError:  # 9999-12-31T23:59:59-14:00 is past year 9999 in UTC
            raise ValidationError(self.error_messages["invalid"], code="invalid") from None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time, as the same instant in UTC: PostgreSQL refuses a literal whose offset
        is beyond ±15:59 (a 500 otherwise), which Python's datetimes allow. A time that is not one
    in UTC (past the year 9999, or before the year 1) is a 400 like any bad time."""

    field_class = UtcIsoDateTimeField
