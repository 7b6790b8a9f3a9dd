from django.urls import path

from webhooks.api import views

urlpatterns = [
    path("", views.DeliveryList.as_view(), name="deliveries"),
    path("replay", views.DeliveryReplay.as_view(), name="deliveries-replay"),
    path("<uuid:event_id>", views.DeliveryDetail.as_view(), name="delivery"),
]
