from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "tasks"
    verbose_name = "Tasks"

    def ready(self) -> None:
        from a2a_platform.lib import pg_timestamps, tracing

        # The task store reads timestamps on every hot path (claims, snapshots).
        pg_timestamps.install()
        # Span export when OTEL_* configures it: here because every process (web, worker,
        # beat, commands) runs it after the settings and before Django loads its middleware
        # or anything opens a connection or an HTTP session, which the instrumentations wrap.
        tracing.configure()
