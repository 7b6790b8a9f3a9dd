"""Cursor pagination for every list: opaque `next` / `previous` links, `pageSize` up to 500.
The ordering is the view's (`ordering`), or the whitelisted one asked for with `?ordering=`
(non-null columns only); ties on the first column are kept apart by the cursor's offset, so a
page never repeats or skips a row that did not change. A cursor not handed out is a 400,
whatever it decodes to: its position must be a value of the ordering's first column (a
position the column cannot hold, or a NUL, would reach the database and fail there)."""

from __future__ import annotations

from django.core.exceptions import FieldDoesNotExist, ValidationError
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination

from a2a_platform.api.errors import invalid


class CursorPages(CursorPagination):
    page_size = 50
    page_size_query_param = "pageSize"
    max_page_size = 500
    ordering = "-created_at"

    def get_page_size(self, request):
        # DRF silently caps or ignores a bad page_size; a caller asking for too much is told.
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise invalid(self.page_size_query_param, f"1 to {self.max_page_size}")
        return int(raw)

    def get_schema_operation_parameters(self, view):
        params = super().get_schema_operation_parameters(view)
        for param in params:
            if param["name"] == self.page_size_query_param:
                param["schema"].update(minimum=1, maximum=self.max_page_size)
        return params

    def get_paginated_response_schema(self, schema):
        answer = super().get_paginated_response_schema(schema)
        for link in ("next", "previous"):
            # DRF's example is another API's URL, which a client could not follow here.
            answer["properties"][link].pop("example", None)
            answer["properties"][link]["description"] = f"the {link} page, to follow as given"
        return answer

    def paginate_queryset(self, queryset, request, view=None):
        self._model = queryset.model  # decode_cursor checks a position against its column
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        try:
            cursor = super().decode_cursor(request)
            if cursor is not None and cursor.position is not None:
                cursor = Cursor(cursor.offset, cursor.reverse, self._position(cursor.position))
        except (NotFound, ValidationError, ValueError, TypeError, OverflowError):
            raise invalid(self.cursor_query_param, "not a cursor this list handed out") from None
        return cursor

    def _position(self, position: str):
        """The position as a value of the first ordering column (ValueError if it is not)."""
        if "\x00" in position:
            raise ValueError("NUL")
        name = self.ordering[0].lstrip("-")
        try:
            field = self._model._meta.get_field(name)
        except FieldDoesNotExist:
            return position  # an annotation: compared as given
        value = field.to_python(position)
        if value is None:
            raise ValueError("no position")
        # the lookup's own preparation (an integer column refuses what it cannot hold)
        field.get_prep_value(value)
        return position
