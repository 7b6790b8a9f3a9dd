"""`/api/v1/`: one list of routes per resource, so each resource module adds its own lines.
Any other path under /api/ answers the JSON 404 (a2a_platform/urls.py)."""

from __future__ import annotations

from django.urls import path

from a2a_platform.api import (
    agents,
    alerts,
    deliveries,
    endpoints,
    push_configs,
    rebinds,
    tasks,
    tokens,
)

delivery_urls = [
    path("deliveries/", deliveries.DeliveryList.as_view(), name="deliveries"),
    path("deliveries/replay", deliveries.DeliveryReplay.as_view(), name="deliveries-replay"),
    path("deliveries/retry", deliveries.DeliveryRetry.as_view(), name="deliveries-retry"),
    path("deliveries/<str:event_id>", deliveries.DeliveryDetail.as_view(), name="delivery"),
]

rebind_urls = [
    path("rebinds/", rebinds.RebindList.as_view(), name="rebinds"),
    path("rebinds/<str:pk>", rebinds.RebindDetail.as_view(), name="rebind"),
    *(
        path(f"rebinds/<str:pk>/{action}", view.as_view(), name=f"rebind-{action}")
        for action, view in rebinds.ACTIONS.items()
    ),
]

token_urls = [
    path("tokens/", tokens.TokenList.as_view(), name="api-tokens"),
    path("tokens/<str:pk>", tokens.TokenDetail.as_view(), name="api-token"),
    path("tokens/<str:pk>/revoke", tokens.TokenRevoke.as_view(), name="api-token-revoke"),
]

task_urls = [
    path("tasks/", tasks.TaskList.as_view(), name="tasks"),
    path("tasks/<str:task_id>", tasks.TaskDetail.as_view(), name="task"),
    path(
        "tasks/<str:task_id>/push-configs",
        push_configs.PushConfigList.as_view(),
        name="task-push-configs",
    ),
    path(
        "tasks/<str:task_id>/push-configs/<str:config_id>",
        push_configs.PushConfigDetail.as_view(),
        name="task-push-config",
    ),
]

endpoint_urls = [
    path("endpoints/", endpoints.EndpointList.as_view(), name="endpoints"),
    path("endpoints/<str:endpoint_id>", endpoints.EndpointDetail.as_view(), name="endpoint"),
    path(
        "endpoints/<str:endpoint_id>/pause",
        endpoints.EndpointPause.as_view(),
        name="endpoint-pause",
    ),
    path(
        "endpoints/<str:endpoint_id>/resume",
        endpoints.EndpointResume.as_view(),
        name="endpoint-resume",
    ),
]

agent_urls = [
    path("agents/", agents.AgentList.as_view(), name="agents"),
    path("agents/<slug:slug>", agents.AgentDetail.as_view(), name="agent"),
    path("agents/<slug:slug>/keys/", agents.ApiKeyList.as_view(), name="agent-keys"),
    path(
        "agents/<slug:slug>/keys/<str:key_id>/revoke",
        agents.ApiKeyRevoke.as_view(),
        name="agent-key-revoke",
    ),
    path(
        "agents/<slug:slug>/signing-keys/",
        agents.SigningKeyList.as_view(),
        name="agent-signing-keys",
    ),
    path(
        "agents/<slug:slug>/signing-keys/rotate",
        agents.SigningKeyRotate.as_view(),
        name="agent-signing-key-rotate",
    ),
]

alert_urls = [
    path("alerts/", alerts.AlertList.as_view(), name="alerts"),
    path("alerts/<str:pk>/resolve", alerts.AlertResolve.as_view(), name="alert-resolve"),
    path("dashboard", alerts.Dashboard.as_view(), name="dashboard"),
]

urlpatterns = [
    *agent_urls,
    *alert_urls,
    *delivery_urls,
    *rebind_urls,
    *token_urls,
    *task_urls,
    *endpoint_urls,
]
