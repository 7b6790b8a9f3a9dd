from django.contrib import admin
from django.urls import include, path

from a2a_platform import health, home

urlpatterns = [
    path("", home.home, name="home"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/v1/worker/", include("tasks.api.urls")),
    path("api/v1/deliveries/", include("webhooks.api.urls")),
]
