"""Push configs with their binding versions (credentials masked), and the task page with
the task's push channel history: versions, rebind moves and channel notices."""

from django.contrib import admin
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html

from a2a_platform.lib.admin import ReadOnlyAdmin, ReadOnlyInline
from a2a_platform.lib.times import when
from tasks.admin import TaskAdmin
from tasks.models import Task
from webhooks.console.endpoint_probe import url_shown
from webhooks.models import Delivery, DeliveryState, MoveState, PushBinding, PushConfig
from webhooks.rebinds import console as rebind_console
from webhooks.selectors import binding_secrets_masked, binding_status, task_channel_history


class BindingInline(ReadOnlyInline):
    """A config's binding versions, credentials masked (selectors.binding_secrets_masked:
    whether a token and credentials are set, the scheme; nothing decrypted)."""

    model = PushBinding
    fields = (
        "version",
        "status",
        "url_masked",
        "credentials",
        "endpoint",
        "created_at",
        "activated_at",
        "retired_at",
    )

    @admin.display(description="status")
    def status(self, obj: PushBinding) -> str:
        return binding_status(obj)

    @admin.display(description="URL")
    def url_masked(self, obj: PushBinding) -> str:
        return url_shown(obj.url)

    @admin.display(description="credentials")
    def credentials(self, obj: PushBinding) -> str:
        masked = binding_secrets_masked(obj)
        auth = masked["authentication"]
        parts = [f"token {masked['token'] or 'none'}"]
        if auth:
            parts.append(
                f"{auth['scheme'] or 'no scheme'}: credentials {auth['credentials'] or 'none'}"
            )
        return "; ".join(parts)


@admin.register(PushConfig)
class PushConfigAdmin(ReadOnlyAdmin):
    list_display = ("config_id", "task", "current_version", "created_at", "deleted_at")
    search_fields = ("config_id", "=task__id")
    list_select_related = ("task",)
    inlines = [BindingInline]


class TaskChannelsAdmin(TaskAdmin):
    """tasks/admin.py's task page with the task's push channel history (the webhooks app sits
    above tasks, so it extends the task admin rather than tasks importing webhooks)."""

    readonly_fields = ("deliveries", "channel_history")

    @admin.display(description="webhook deliveries")
    def deliveries(self, obj):
        count = Delivery.objects.filter(task=obj).count()
        url = reverse("admin:webhooks_delivery_changelist") + f"?task={obj.pk}"
        return format_html(
            '<a href="{}" id="task-deliveries">{} deliveries of this task</a>', url, count
        )

    @admin.display(description="push channel history")
    def channel_history(self, obj):
        history = task_channel_history(obj)
        # The receiver's last answer to each notice (its status and body, as the deliveries
        # admin's attempt timeline shows it): a dead notice keeps its task on the old channel.
        answers = rebind_console.notice_answers(n["id"] for n in history["notices"])
        notice_of = {n["id"]: n for n in history["notices"]}
        versions = [
            {
                "channel": v["channel"],
                "status": v["status"],
                "url": url_shown(v["url"]),
                "token": "token set" if v["token"] else "no token",
                "made": when(v["createdAt"]),
                "activated": when(v["activatedAt"]),
                "retired": when(v["retiredAt"]),
            }
            for v in history["versions"]
        ]
        moves = []
        for m in history["moves"]:
            notice = notice_of.get(m["notice"])
            stuck = (
                m["state"] == MoveState.NOTICE_PENDING
                and notice is not None
                and notice["state"] == "dead"
            )
            moves.append(
                {
                    "state": m["state"],
                    "rebind": m["rebindId"],
                    "config": m["configId"],
                    "from_version": m["fromVersion"],
                    "to_version": m["toVersion"] if m["toVersion"] is not None else "-",
                    "label": (
                        MoveState(m["state"]).label
                        if m["state"] in MoveState.values
                        else m["state"]
                    ),
                    "stuck": stuck,
                    "said": rebind_console.answer_text(answers.get(m["notice"])) if stuck else "",
                    "notice": m["notice"] or "-",
                    "made": when(m["createdAt"]),
                    "finished": when(m["finishedAt"]),
                }
            )
        notices = [
            {
                "state": n["state"],
                "id": n["id"],
                "kind": n["kind"],
                "config": n["configId"],
                "version": n["version"],
                "dead": n["state"] == DeliveryState.DEAD,
                "label": DeliveryState(n["state"]).label,
                "attempts": n["attempts"],
                "answer": rebind_console.answer_text(answers.get(n["id"])) or "-",
                "last_error": n["lastError"] or "-",
                "made": when(n["createdAt"]),
            }
            for n in history["notices"]
        ]
        context = {"versions": versions, "moves": moves, "notices": notices}
        return render_to_string("admin/webhooks/task/channel_history.html", context)


admin.site.unregister(Task)
admin.site.register(Task, TaskChannelsAdmin)
