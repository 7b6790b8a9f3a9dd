from django.urls import path

from tasks.api import views

urlpatterns = [
    path("tasks", views.TaskListView.as_view(), name="worker-tasks"),
    path("claim", views.ClaimView.as_view(), name="worker-claim"),
    path("dispatches/<int:dispatch_id>/renew", views.DispatchRenewView.as_view()),
    path("dispatches/<int:dispatch_id>/finish", views.DispatchFinishView.as_view()),
    path("tasks/<str:task_id>/transition", views.TransitionView.as_view()),
    path("tasks/<str:task_id>/artifacts", views.ArtifactView.as_view()),
    path("tasks/<str:task_id>/messages", views.MessageView.as_view()),
]
