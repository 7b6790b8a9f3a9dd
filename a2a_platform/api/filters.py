"""Filtering and ordering helpers: django-filter FilterSets (a bad value is a 400 naming the
filter) and `?ordering=` limited to each view's `ordering_fields` (anything else is a 400)."""

from __future__ import annotations

import datetime as dt

import django_filters
from django.core.exceptions import ValidationError
from rest_framework.filters import OrderingFilter

from a2a_platform.api.errors import invalid
from tasks.api.serializers import camel


class WhitelistedOrdering(OrderingFilter):
    """`?ordering=a,-b` over the view's `ordering_fields` only, by their wire (camelCase)
    names; another field is refused. The schema lists the values as an enum."""

    @staticmethod
    def _allowed(view) -> dict[str, str]:
        """Wire name -> model field, either way round (`createdAt`, `-createdAt`)."""
        names = {camel(f): f for f in getattr(view, "ordering_fields", None) or []}
        return names | {f"-{wire}": f"-{field}" for wire, field in names.items()}

    def get_ordering(self, request, queryset, view):
        params = request.query_params.get(self.ordering_param)
        if params is not None:
            fields = [param.strip() for param in params.split(",")]
            allowed = self._allowed(view)
            if not all(f in allowed for f in fields):
                raise invalid(
                    self.ordering_param,
                    f"order by {', '.join(sorted(allowed)) or 'nothing'}, comma-separated",
                )
            # Ties on the first key are kept apart by the cursor's offset (pagination.py).
            return [allowed[f] for f in fields]
        return self.get_default_ordering(view)

    def get_schema_operation_parameters(self, view):
        return [
            {
                "name": self.ordering_param,
                "required": False,
                "in": "query",
                "description": "the order of the list (a leading - reverses a key)",
                "schema": {
                    "type": "array",
                    "items": {"type": "string", "enum": sorted(self._allowed(view))},
                    "minItems": 1,
                },
                "style": "form",
                "explode": False,
            }
        ]


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
