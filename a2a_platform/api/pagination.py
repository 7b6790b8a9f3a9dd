"""Cursor pagination for every list: opaque `next` / `previous` links, `page_size` up to 500.
The ordering is the view's (`ordering`), or the whitelisted one asked for with `?ordering=`
(non-null columns only); ties on the first column are kept apart by the cursor's offset, so a
page never repeats or skips a row that did not change. A cursor not handed out is a 400."""

from __future__ import annotations

from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination

from a2a_platform.api.errors import invalid


class CursorPages(CursorPagination):
    page_size = 50
    page_size_query_param = "page_size"
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

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise invalid(self.cursor_query_param, "not a cursor this list handed out") from None
