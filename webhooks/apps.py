from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks"

    def ready(self) -> None:
        from tasks.hooks import register_event_hook
        from webhooks import signals  # noqa: F401 (worker start re-enqueues the backlog)
        from webhooks.services import on_task_event

        register_event_hook(on_task_event)
