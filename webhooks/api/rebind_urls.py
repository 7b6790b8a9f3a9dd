from django.urls import path

from webhooks.api import rebinds

urlpatterns = [
    path("", rebinds.RebindList.as_view(), name="rebinds"),
    path("<str:pk>", rebinds.RebindDetail.as_view(), name="rebind"),
    path("<str:pk>/<str:action>", rebinds.RebindAction.as_view(), name="rebind-action"),
]
