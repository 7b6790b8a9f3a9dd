"""The audit side of the console: alerts (resolved by an operator) and the operator actions'
log."""

from django.contrib import admin

from a2a_platform.lib.admin import ReadOnlyAdmin
from agents.models import OperatorAction
from webhooks import services
from webhooks.admin.display import pretty
from webhooks.console.dashboard import target_text
from webhooks.models import Alert


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ("kind", "message", "endpoint", "count", "last_seen_at", "resolved_at")
    list_filter = ("kind", "resolved_at")
    actions = ["resolve"]

    @admin.action(description="Mark resolved", permissions=["operate"])
    def resolve(self, request, queryset):
        for alert in queryset:
            services.alert_resolve(alert_pk=alert.pk, actor=request.user.get_username())
        self.message_user(request, "resolved")


class ActionFilter(admin.SimpleListFilter):
    """Operator actions by kind, named in words ("pause endpoint", not `pause_endpoint`)."""

    title = "action"
    parameter_name = "action"

    def lookups(self, request, model_admin):
        names = OperatorAction.objects.values_list("action", flat=True).distinct()
        return [(name, name.replace("_", " ")) for name in sorted(names)]

    def queryset(self, request, queryset):
        return queryset.filter(action=self.value()) if self.value() else queryset


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action_shown", "target_shown")
    list_filter = (ActionFilter,)
    fields = readonly_fields = ("created_at", "actor", "action_shown", "target_shown", "detail")

    class Media:
        css = {"all": ["webhooks/console.css"]}

    @admin.display(description="detail")
    def detail(self, obj: OperatorAction) -> str:
        return pretty(obj.target)

    @admin.display(description="action", ordering="action")
    def action_shown(self, obj: OperatorAction) -> str:
        return obj.action.replace("_", " ")

    @admin.display(description="target")
    def target_shown(self, obj: OperatorAction) -> str:
        return target_text(obj.target) or "-"
