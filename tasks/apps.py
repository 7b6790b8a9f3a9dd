from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = "Tasks"

    def ready(self) -> None:
        from a2a_platform.lib import pg_timestamps

        # The task store reads timestamps on every hot path (claims, snapshots).
        pg_timestamps.install()
