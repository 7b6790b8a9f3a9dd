from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from tasks.hooks import register_event_hook
        from webhooks import signals  # noqa: F401 (worker start re-enqueues the backlog)
        from webhooks.console.operator_groups import sync_groups
        from webhooks.services import deliveries_write_for_events

        register_event_hook(deliveries_write_for_events)
        # After every app's permissions exist (each migrate's last post_migrate: ours).
        post_migrate.connect(
            sync_groups, sender=self, dispatch_uid="webhooks.console.operator_groups"
        )
