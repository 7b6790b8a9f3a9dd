"""Rebinds with their moves: the rebind's page (a live console above the request as it was
made), the start wizard, the console's decisions with their confirmations, a signing key's
retirement, and the moves' list (advance, cut over, abort, move now, finish on the old
channel; starting one is also `manage.py rebind`, docs/rebinds.md)."""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from a2a_platform.lib.admin import SECRET_FIELDS, ReadOnlyAdmin
from a2a_platform.lib.times import when_text
from agents.models import SigningKey
from agents.signing import SigningKeyError
from webhooks.admin.display import skipped_text
from webhooks.console import delivery_actions, key_actions
from webhooks.errors import RebindConflict, RebindInvalid, WebhookError
from webhooks.models import ChannelMove, DeliveryState, MoveState, Rebind
from webhooks.rebinds import console as rebind_console
from webhooks.rebinds import machine as rebind_machine
from webhooks.rebinds import operations as rebinds
from webhooks.rebinds.checks import rebind_preview
from webhooks.rebinds.forms import RebindForm
from webhooks.rebinds.machine import IllegalRebindTransition
from webhooks.selectors import rebinds_with_on_old

# The rebind's page shows these as they were asked for; what changes as it runs (its state,
# deadline, counts, moves, times) is the console's, from its one payload (rebind_console.py),
# so that nothing below the console still says "draining" once it is over.
REBIND_REQUEST_FIELDS = (
    "id",
    "agent",
    "rotate_key",
    "move_from",
    "move_to",
    "move_origin",
    "config",
    "new_url",
    "new_auth_scheme",
    "replaces_credentials",
    "client_binding",
    "policy",
    "in_flight_tasks",
    "deadline_seconds",
    "on_timeout",
    "actor",
    "forced",
    "scheduled_for",
    "old_key",
    "new_key",
    "created_at",
)


class RebindActionForm(helpers.ActionForm):
    # "Abort" records why (the service refuses an abort without a reason).
    reason = forms.CharField(required=False, label="Reason (abort):")


@admin.register(Rebind)
class RebindAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "agent",
        "state",
        "policy",
        "scope",
        "on_old",
        "moved",
        "orphaned",
        "scheduled_for",
        "deadline",
        "actor",
        "created_at",
    )
    list_filter = ("state", "policy", "agent")
    list_select_related = ("agent",)
    # A read-only field is rendered whatever `exclude` says: the secrets are left out here.
    fields = readonly_fields = [f for f in REBIND_REQUEST_FIELDS if f not in SECRET_FIELDS]
    exclude = ("new_token_encrypted", "new_credentials_encrypted")
    actions = ["advance", "cut_over", "abort"]
    action_form = RebindActionForm
    change_list_template = "admin/webhooks/rebind/change_list.html"
    # The stock read-only form below a console: chips, progress, countdown, the live list of
    # tasks still on the old version and the operator's decisions (webhooks/rebinds/console.py).
    change_form_template = "admin/webhooks/rebind/change_form.html"

    def has_run_rebind_permission(self, request) -> bool:
        return request.user.has_perm("webhooks.run_rebind")

    def get_urls(self):
        wizard = self.admin_site.admin_view(self.wizard_view)
        retire = self.admin_site.admin_view(self.retire_key_view)
        live = self.admin_site.admin_view(self.live_view)
        act = self.admin_site.admin_view(self.action_view)
        return [
            path("start/", wizard, name="webhooks_rebind_start"),
            path("retire-key/<int:key_pk>/", retire, name="webhooks_rebind_retire_key"),
            # Before the stock URLs: their `<path:object_id>/` would take these.
            path("<path:object_id>/live/", live, name="webhooks_rebind_live"),
            path("<path:object_id>/do/<str:action>/", act, name="webhooks_rebind_action"),
            *super().get_urls(),
        ]

    def _console_context(self, request, rebind: Rebind) -> dict:
        return {
            "console": rebind_console.rebind_console(rebind),
            "console_live_url": reverse("admin:webhooks_rebind_live", args=[rebind.pk]),
            "console_action_urls": {
                name: reverse("admin:webhooks_rebind_action", args=[rebind.pk, name])
                for name in rebind_console.ACTIONS
            },
            "console_task_url": reverse("admin:tasks_task_changelist"),
            "can_run_rebind": self.has_run_rebind_permission(request),
        }

    def change_view(self, request, object_id, form_url="", extra_context=None):
        rebind = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if rebind is not None and self.has_view_permission(request, rebind):
            extra.update(self._console_context(request, rebind))
            # The heading and the window's title from the payload (the JS keeps them live);
            # the row's str() names the state as stored ("cut_over") and goes stale.
            extra["subtitle"] = extra["console"]["title"]
        return super().change_view(request, object_id, form_url, extra_context=extra)

    @admin.display(description="in-flight tasks")
    def in_flight_tasks(self, obj: Rebind) -> str:
        return rebind_console.in_flight_text(obj)

    def live_view(self, request, object_id):
        """The console's JSON, polled by webhooks/static/webhooks/rebind_page.js."""
        rebind = self.get_object(request, object_id)
        if not self.has_view_permission(request, rebind):
            raise PermissionDenied
        if rebind is None:
            raise Http404("no such rebind")
        response = JsonResponse(rebind_console.rebind_console(rebind))
        response["Cache-Control"] = "no-store"
        return response

    def action_view(self, request, object_id, action: str):
        """One decision on the rebind's page: a confirmation saying what it will do (as
        delete_confirmation does), then, once confirmed (POST confirm=yes), the service."""
        if action not in rebind_console.ACTIONS:
            raise Http404("no such rebind action")
        if not self.has_run_rebind_permission(request):
            raise PermissionDenied
        rebind = self.get_object(request, object_id)
        if rebind is None:
            raise Http404("no such rebind")
        back = reverse("admin:webhooks_rebind_change", args=[rebind.pk])
        operation = rebind_console.ACTIONS[action]
        if not rebind_machine.can(operation, rebind.state):
            exc = IllegalRebindTransition(operation, rebind.state)
            if action == "replay_notice":
                exc = (
                    "a notice is replayed only while the rebind drains; it is "
                    f"{rebind_console.state_label(rebind.state)}"
                )
            self.message_user(request, f"rebind {rebind.pk}: {exc}", messages.ERROR)
            return HttpResponseRedirect(back)
        data = request.POST if request.method == "POST" else request.GET
        try:
            plan = rebind_console.action_plan(rebind, action, data)
        except rebind_console.ActionInputInvalid as exc:
            self.message_user(request, f"rebind {rebind.pk}: {exc}", messages.ERROR)
            return HttpResponseRedirect(back)
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            try:
                done = self._run_action(rebind, plan, request.user.get_username())
            except (WebhookError, IllegalRebindTransition) as exc:
                self.message_user(request, f"rebind {rebind.pk}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"rebind {rebind.pk}: {done}", messages.SUCCESS)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": rebind,
            "plan": plan,
            "back": back,
            "action_url": request.path,
            "task_url": reverse("admin:tasks_task_changelist"),
            "title": f"Confirm: {plan.summary.split(':')[0]}",
            "delivery_url": reverse("admin:webhooks_delivery_changelist"),
        }
        return TemplateResponse(request, "admin/webhooks/rebind/action_confirm.html", context)

    def _run_action(self, rebind: Rebind, plan, actor: str) -> str:
        """The confirmed decision, through its rebind service (each audits itself)."""
        if plan.action == "move_now":
            n = rebinds.rebind_moves_now(rebind.pk, move_pks=plan.move_pks, actor=actor)
            return f"{n} task(s) moved now"
        if plan.action == "finish_on_old":
            n = rebinds.rebind_moves_finish_on_old(rebind.pk, move_pks=plan.move_pks, actor=actor)
            return f"{n} task(s) left to finish on the old channel"
        if plan.action == "replay_notice":
            # The deliveries admin's replay (audited there as `replay_deliveries`).
            outcome = delivery_actions.delivery_replay_explained(
                event_ids=plan.notices, actor=actor
            )
            done = f"{outcome.replayed} of {outcome.requested} dead notice(s) replayed"
            if outcome.skipped:
                done += f"; not replayed: {skipped_text(outcome.skipped)}"
            return done
        if plan.action == "cut_over":
            done = rebinds.rebind_cutover(rebind.pk, actor=actor)
            return rebind_console.state_label(done.state)
        if plan.action == "extend":
            done = rebinds.rebind_extend(rebind.pk, seconds=plan.seconds, actor=actor)
            return f"deadline extended by {plan.minutes} min, to {when_text(done.deadline)}"
        rebinds.rebind_abort(rebind.pk, actor=actor, reason=plan.reason)
        return "aborted"

    def retire_key_view(self, request, key_pk: int):
        """Retire a retiring signing key (linked from the agent's page): a confirmation,
        then webhooks/console/key_actions.py (refused while an open rebind uses the key)."""
        if not self.has_run_rebind_permission(request):
            raise PermissionDenied
        key = SigningKey.objects.filter(pk=key_pk).select_related("agent").first()
        if key is None:
            raise Http404("no such signing key")
        back = reverse("admin:agents_agent_change", args=[key.agent_id])
        if request.method == "POST":
            try:
                key_actions.signing_key_retire_checked(
                    key_pk=key.pk, actor=request.user.get_username()
                )
            except SigningKeyError as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                self.message_user(request, f"key {key.kid} retired", messages.SUCCESS)
            return HttpResponseRedirect(back)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "key": key,
            "back": back,
            "title": f"Retire signing key {key.kid}",
        }
        return TemplateResponse(request, "admin/webhooks/rebind/retire_key.html", context)

    def changelist_view(self, request, extra_context=None):
        extra = {"can_run_rebind": self.has_run_rebind_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def wizard_view(self, request):
        """Start a rebind in two steps: the form, then a confirmation page with every check's
        result and the blast radius (tasks on the old version by state, configs, endpoints,
        the list); nothing is written until it is confirmed."""
        if not self.has_run_rebind_permission(request):
            raise PermissionDenied
        # Links (the agent's "rotate" link) may prefill the form: ?agent=…&operations=….
        initial = {
            name: request.GET.getlist(name) if name == "operations" else request.GET[name]
            for name in ("agent", "operations", "task_id", "config_id")
            if name in request.GET
        }
        form = RebindForm(request.POST or None, initial=initial)
        context = {**self.admin_site.each_context(request), "opts": self.opts, "form": form}
        context["title"] = "Start a rebind"
        if request.method == "POST" and form.is_valid():
            rebind_request = form.rebind_request()
            try:
                preview = rebind_preview(rebind_request)
                if request.POST.get("confirm") == "yes" and (
                    preview.conflict is None or rebind_request.force
                ):
                    rebind = rebinds.rebind_start(rebind_request, actor=request.user.get_username())
                    self.message_user(request, f"rebind {rebind.pk}: {rebind.state}")
                    return HttpResponseRedirect(
                        reverse("admin:webhooks_rebind_change", args=[rebind.pk])
                    )
            except RebindInvalid as exc:
                form.refused(exc)
            except RebindConflict as exc:
                form.add_error("force", str(exc))
            else:
                context.update(preview=preview, title="Confirm the rebind")
                return TemplateResponse(request, "admin/webhooks/rebind/confirm.html", context)
        return TemplateResponse(request, "admin/webhooks/rebind/start.html", context)

    @admin.display(description="scope")
    def scope(self, obj: Rebind) -> str:
        parts = ["rotate key"] if obj.rotate_key else []
        if obj.move_from:
            parts.append(f"{obj.move_from} → {obj.move_to}")
        if obj.config_id:
            parts.append(f"config {obj.config_id}")
        return ", ".join(parts)

    def get_queryset(self, request):
        return rebinds_with_on_old(super().get_queryset(request))

    @admin.display(description="on old version", ordering="on_old_now")
    def on_old(self, obj: Rebind) -> str:
        count = obj.on_old_now
        url = reverse("admin:webhooks_channelmove_changelist")
        return format_html(
            '<a href="{}?rebind__id__exact={}&on_old=yes">{}</a>',
            url,
            obj.pk,
            count,
        )

    @admin.display(description="moved")
    def moved(self, obj: Rebind) -> int:
        return (obj.counts or {}).get("moved", 0)

    @admin.display(description="orphaned")
    def orphaned(self, obj: Rebind) -> int:
        return (obj.counts or {}).get("orphaned", 0)

    def _each(self, request, queryset, step, done: str) -> None:
        for rebind in queryset:
            try:
                step(rebind)
            except (WebhookError, IllegalRebindTransition) as exc:
                self.message_user(request, f"rebind {rebind.pk}: {exc}", level="error")
            else:
                self.message_user(request, f"rebind {rebind.pk}: {done}")

    @admin.action(description="Advance now (what the monitor does)", permissions=["operate"])
    def advance(self, request, queryset):
        self._each(request, queryset, lambda r: rebinds.rebind_advance(r.pk), "advanced")

    @admin.action(description="Cut over (orphan what is left)", permissions=["run_rebind"])
    def cut_over(self, request, queryset):
        actor = request.user.get_username()
        self._each(
            request, queryset, lambda r: rebinds.rebind_cutover(r.pk, actor=actor), "cut over"
        )

    @admin.action(description="Abort", permissions=["run_rebind"])
    def abort(self, request, queryset):
        actor, reason = request.user.get_username(), request.POST.get("reason", "")
        self._each(
            request,
            queryset,
            lambda r: rebinds.rebind_abort(r.pk, actor=actor, reason=reason),
            "aborted",
        )


class OnOldFilter(admin.SimpleListFilter):
    """The moves still on the old version, by the one rule (`ChannelMoveQuerySet.on_old`): the
    list the rebind's "on old version" count links to, row for row."""

    title = "on the old version"
    parameter_name = "on_old"

    def lookups(self, request, model_admin):
        return [("yes", "yes")]

    def queryset(self, request, queryset):
        return queryset.on_old() if self.value() == "yes" else queryset


@admin.register(ChannelMove)
class ChannelMoveAdmin(ReadOnlyAdmin):
    """A rebind's moves, one per config: filter by rebind and state for the tasks still on
    the old version, and decide for the selected ones (the rebind services)."""

    list_display = ("task", "task_state", "config", "state", "notice_state", "created_at")
    list_filter = (OnOldFilter, "state", "rebind")
    list_select_related = ("task", "config", "notice")
    search_fields = ("=task__id", "config__config_id")
    actions = ["move_now", "finish_on_old"]

    @admin.display(description="task state")
    def task_state(self, obj: ChannelMove) -> str:
        return obj.task.task_state.short

    @admin.display(description="notice")
    def notice_state(self, obj: ChannelMove) -> str:
        notice = obj.notice
        if notice is None:
            return "-"
        said = [f"HTTP {notice.last_status}"] if notice.last_status else []
        said += [notice.last_error] if notice.last_error else []
        text = notice.get_state_display() + (f" ({'; '.join(said)})" if said else "")
        if notice.state == DeliveryState.DEAD and obj.state == MoveState.NOTICE_PENDING:
            return format_html('<strong class="a2a-dead">{}: task stuck on old</strong>', text)
        return text

    def has_run_rebind_permission(self, request) -> bool:
        return request.user.has_perm("webhooks.run_rebind")

    def _by_rebind(self, request, queryset, step, done: str) -> None:
        actor = request.user.get_username()
        by_rebind: dict = {}
        for move in queryset:
            by_rebind.setdefault(move.rebind_id, []).append(move.pk)
        for rebind_pk, move_pks in by_rebind.items():
            try:
                count = step(rebind_pk, move_pks=move_pks, actor=actor)
            except (WebhookError, IllegalRebindTransition) as exc:
                self.message_user(request, f"rebind {rebind_pk}: {exc}", level="error")
            else:
                self.message_user(request, f"rebind {rebind_pk}: {count} {done}")

    @admin.action(
        description="Move now (without waiting for the notice)", permissions=["run_rebind"]
    )
    def move_now(self, request, queryset):
        self._by_rebind(request, queryset, rebinds.rebind_moves_now, "moved")

    @admin.action(description="Let finish on the old channel", permissions=["run_rebind"])
    def finish_on_old(self, request, queryset):
        self._by_rebind(request, queryset, rebinds.rebind_moves_finish_on_old, "left on old")
