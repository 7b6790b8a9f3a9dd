"""Operators' page of integrators' tokens: create one (the secret is shown once, on the page
that follows, never stored nor put in a message cookie), list, revoke. No edits: a token's
name, scope and user are fixed at creation."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils import timezone

from a2a_platform.api.models import ApiToken
from a2a_platform.api.services import TokenRefused, api_token_create, api_token_revoke
from a2a_platform.lib.admin import SecretLookupsRefused
from a2a_platform.lib.times import ConsoleTimes


class TokenAddForm(forms.ModelForm):
    class Meta:
        model = ApiToken
        fields = ["name", "scope", "user", "expires_at"]

    request = None

    def clean(self):
        data = super().clean()
        user, creator = data.get("user"), self.request.user if self.request else None
        if user and creator and user.pk != creator.pk and not creator.is_superuser:
            self.add_error("user", "only a superuser makes a token for another user")
        expires = data.get("expires_at")
        if expires is not None and expires <= timezone.now():
            self.add_error("expires_at", "must be in the future")
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(ConsoleTimes, SecretLookupsRefused, admin.ModelAdmin):
    list_display = ("name", "prefix", "scope", "user", "created_at", "last_used_at", "state")
    list_filter = ("scope",)
    list_select_related = ("user",)
    search_fields = ("name", "prefix", "user__username")
    readonly_fields = (
        "name",
        "scope",
        "user",
        "prefix",
        "created_by",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    actions = ["revoke"]

    @admin.display(description="state")
    def state(self, obj: ApiToken) -> str:
        if obj.revoked_at:
            return "revoked"
        if obj.expires_at and obj.expires_at <= timezone.now():
            return "expired"
        return "live"

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = TokenAddForm
            form = super().get_form(request, obj, change=change, **kwargs)
            form.request = request
            return form
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request, obj=None):
        return TokenAddForm.Meta.fields if obj is None else self.readonly_fields

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        if change:
            return
        try:
            new = api_token_create(
                name=obj.name,
                scope=obj.scope,
                user=obj.user,
                created_by=request.user,
                expires_at=obj.expires_at,
            )
        except TokenRefused as exc:  # checked by the form first; a race ends here
            raise forms.ValidationError(str(exc)) from None
        obj.pk = new.token.pk
        obj.prefix = new.token.prefix
        obj._state.adding = False
        request._api_token_secret = new

    def save_related(self, request, form, formsets, change):
        """Nothing related; the token was saved by the service."""

    def response_add(self, request, obj, post_url_continue=None):
        new = getattr(request, "_api_token_secret", None)
        if new is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "token": new.token,
            "secret": new.secret,
            "title": "API token created",
        }
        response = TemplateResponse(request, "platform_api/token_created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke the selected tokens", permissions=["change"])
    def revoke(self, request, queryset):
        count = 0
        for token in queryset.filter(revoked_at__isnull=True):
            api_token_revoke(token_id=token.pk, actor=f"admin:{request.user.get_username()}")
            count += 1
        self.message_user(request, f"revoked {count} of {queryset.count()}", messages.SUCCESS)
