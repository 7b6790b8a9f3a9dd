"""The rebind wizard's form (the admin console): every field a rebind request takes, checked
here as a form, then by the rebind services' pre-checks (webhooks/rebind.py)."""

from __future__ import annotations

import re
import uuid

from django import forms
from django.utils import timezone

from agents.models import Agent, OnDrainTimeout, PushChannelPolicy
from webhooks.models import PushConfig
from webhooks.rebind_checks import RebindRequest

_DURATION = re.compile(r"(?P<n>\d+)(?P<unit>[smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """`90`, `90s`, `15m`, `1h`, `2d` → seconds; ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 15m, 1h, 2d)")
    return int(match["n"]) * _UNITS[match["unit"]]


class RebindForm(forms.Form):
    OPERATIONS = [
        ("rotate_key", "rotate the signing key"),
        ("move_prefix", "move a URL prefix"),
        ("config", "replace one config's URL or credentials"),
    ]

    agent = forms.ModelChoiceField(queryset=Agent.objects.order_by("slug"), to_field_name="slug")
    operations = forms.MultipleChoiceField(
        choices=OPERATIONS, widget=forms.CheckboxSelectMultiple, help_text="one or more"
    )
    move_from = forms.CharField(required=False, max_length=2048, label="old URL prefix")
    move_to = forms.CharField(required=False, max_length=2048, label="new URL prefix")
    move_origin = forms.CharField(required=False, max_length=300, label="only on origin")
    task_id = forms.CharField(required=False, label="task id (one config)")
    config_id = forms.CharField(required=False, label="config id (one config)")
    new_url = forms.CharField(required=False, max_length=2048, label="the config's new URL")
    policy = forms.ChoiceField(
        choices=[("", "the agent's declared policy"), *PushChannelPolicy.choices], required=False
    )
    finish_on_old = forms.BooleanField(
        required=False, label="let in-flight tasks finish on the old channel"
    )
    deadline = forms.CharField(
        required=False, help_text="drain deadline: 90s, 15m, 1h, 2d (empty: the agent's)"
    )
    on_timeout = forms.ChoiceField(
        choices=[("", "the agent's declared action"), *OnDrainTimeout.choices], required=False
    )
    at = forms.DateTimeField(
        required=False,
        label="start at (empty: now)",
        help_text="ISO 8601, e.g. 2026-12-24T02:00:00+00:00",
    )
    reason = forms.CharField(required=False, max_length=500)
    force = forms.BooleanField(required=False, label="even over an open rebind of that scope")

    def clean_deadline(self) -> int | None:
        text = self.cleaned_data["deadline"].strip()
        if not text:
            return None
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_at(self):
        at = self.cleaned_data["at"]
        if at is not None and at <= timezone.now():
            raise forms.ValidationError("the start time is in the past")
        return at

    def clean(self):
        data = super().clean()
        ops = set(data.get("operations") or [])
        agent = data.get("agent")
        if "move_prefix" in ops and not (data.get("move_from") and data.get("move_to")):
            self.add_error("move_from", "moving a prefix needs the old and the new prefix")
        if "config" in ops:
            config = None
            try:
                task_pk = uuid.UUID(data.get("task_id") or "")
            except ValueError:
                self.add_error("task_id", "a task id (a UUID)")
            else:
                config = PushConfig.objects.filter(
                    task_id=task_pk, task__agent=agent, config_id=data.get("config_id") or ""
                ).first()
                if config is None:
                    self.add_error("config_id", "no such config of this agent's task")
            data["config"] = config
        return data

    def rebind_request(self) -> RebindRequest:
        data = self.cleaned_data
        ops = set(data["operations"])
        moving = "move_prefix" in ops
        return RebindRequest(
            agent=data["agent"],
            rotate_key="rotate_key" in ops,
            move_from=data["move_from"] if moving else "",
            move_to=data["move_to"] if moving else "",
            move_origin=data["move_origin"] if moving else "",
            config=data.get("config") if "config" in ops else None,
            new_url=data["new_url"] if "config" in ops else "",
            policy=data["policy"] or None,
            finish_on_old=data["finish_on_old"],
            deadline_seconds=data["deadline"],
            on_timeout=data["on_timeout"] or None,
            at=data["at"],
            reason=data["reason"],
            force=data["force"],
        )
