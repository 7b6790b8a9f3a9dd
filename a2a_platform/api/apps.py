from django.apps import AppConfig


class PlatformApiConfig(AppConfig):
    name = "a2a_platform.api"
    label = "platform_api"
    verbose_name = "Management API"
    default_auto_field = "django.db.models.BigAutoField"
