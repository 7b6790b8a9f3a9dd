from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from a2a_platform import health, home, metrics
from a2a_platform.api.fallback import NoRoute
from webhooks.console import views as admin_views

# The admin is the operators' console of the platform (its index is the dashboard).
admin.site.site_header = "A2A Platform"
admin.site.site_title = "A2A Platform"
admin.site.index_title = "Operations dashboard"

urlpatterns = [
    path("", home.home, name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    # Prometheus text exposition (docs/observability.md, "Metrics"); A2A_METRICS_TOKEN guards it.
    path("metrics", metrics.metrics, name="metrics"),
    # Staff only: admin_view redirects anyone else to the admin login (and never caches).
    path(
        "admin/dashboard.json",
        admin.site.admin_view(admin_views.dashboard_json),
        name="admin_dashboard",
    ),
    path("admin/", admin.site.urls),
    path("api/v1/worker/", include("tasks.api.urls")),
    # The management API (docs/api.md), its OpenAPI 3 schema and Swagger UI (no CDN).
    path("api/v1/", include("a2a_platform.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    re_path(r"^api/", NoRoute.as_view()),
]
