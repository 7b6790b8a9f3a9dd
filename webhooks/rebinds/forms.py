"""The rebind wizard's form (the admin console): every field a rebind request takes, parsed
here (types, which operations are ticked and whether each has its input, the one config by
`selectors.agent_push_config`), then checked by the rebind services' pre-checks only
(webhooks/rebinds/checks.py `precheck`, run by the preview and the start): their
`RebindInvalid` is shown on the field it names (`RebindForm.refused`).

A config's new token and credentials are secrets: typed once in password inputs, never
rendered back. The confirmation step carries them sealed (`sealed_secrets`: encrypted with
the secrets-at-rest key, a2a_platform/lib/crypto.py, and dated), so the page holds neither."""

from __future__ import annotations

import json
import re
import time

from django import forms

from a2a_platform.lib import crypto
from agents.models import Agent, OnDrainTimeout, PushChannelPolicy
from webhooks.errors import RebindInvalid
from webhooks.rebinds.checks import RebindRequest
from webhooks.selectors import agent_push_config

_DURATION = re.compile(r"(?P<n>\d+)(?P<unit>[smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """`90`, `90s`, `15m`, `1h`, `2d` → seconds; ValueError otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 15m, 1h, 2d)")
    return int(match["n"]) * _UNITS[match["unit"]]


# How long a confirmation page's sealed secrets stay usable (then: type them again).
SEALED_MAX_AGE_SECONDS = 3600
# A refusal's field (RebindInvalid.field, the request's names) → this form's field; any other
# is shown on the form as a whole.
REFUSED_FIELD = {
    "agent": "agent",
    "move_from": "move_from",
    "move_to": "move_to",
    "move_prefix": "move_from",
    "deadline": "deadline",
    "at": "at",
    "policy": "policy",
    "on_timeout": "on_timeout",
    "finish_on_old": "finish_on_old",
    "new_url": "new_url",
    "config": "config_id",
    # credentials_problem's fields, prefixed by the pre-check.
    "new_token": "new_token",
    "new_authentication.scheme": "new_auth_scheme",
    "new_authentication.credentials": "new_credentials",
}


def seal_secrets(token: str, credentials: str) -> str:
    return crypto.encrypt(json.dumps({"t": token, "c": credentials, "at": int(time.time())}))


def unseal_secrets(sealed: str) -> tuple[str, str]:
    """(token, credentials) from `seal_secrets`; ValueError when altered or too old."""
    try:
        data = json.loads(crypto.decrypt(sealed))
        token, credentials, at = data["t"], data["c"], data["at"]
    except (crypto.SecretDecryptionError, ValueError, KeyError, TypeError):
        raise ValueError("the sealed token and credentials are unreadable") from None
    if not (isinstance(token, str) and isinstance(credentials, str) and isinstance(at, int)):
        raise ValueError("the sealed token and credentials are unreadable")
    if time.time() - at > SEALED_MAX_AGE_SECONDS:
        raise ValueError("the sealed token and credentials expired")
    return token, credentials


# URL inputs wide enough to read a URL.
URL_INPUT = forms.TextInput(attrs={"size": 80, "class": "a2a-url-input"})


class RebindForm(forms.Form):
    OPERATIONS = [
        ("rotate_key", "rotate the signing key"),
        ("move_prefix", "move a URL prefix"),
        ("config", "replace one config's URL or credentials"),
    ]

    # The wizard's sections, each with the operation it belongs to (None: every rebind's):
    # the page shows only the chosen operations' sections (a little script; without it,
    # all of them).
    SECTIONS = [
        ("What to rebind", None, ("agent", "operations")),
        ("Move a URL prefix", "move_prefix", ("move_from", "move_to", "move_origin")),
        (
            "Replace one config's URL or credentials",
            "config",
            (
                "task_id",
                "config_id",
                "new_url",
                "new_token",
                "new_auth_scheme",
                "new_credentials",
                "remove_credentials",
            ),
        ),
        ("Tasks in flight", None, ("policy", "finish_on_old", "deadline", "on_timeout")),
        ("When and why", None, ("at", "reason", "force")),
    ]

    agent = forms.ModelChoiceField(
        queryset=Agent.objects.order_by("slug"),
        to_field_name="slug",
        help_text="whose push channels (and signing key) the rebind changes",
    )
    operations = forms.MultipleChoiceField(
        choices=OPERATIONS,
        widget=forms.CheckboxSelectMultiple,
        help_text=(
            "one or more. Rotating the key publishes a new signing key beside the old one, "
            "then signs with it; moving a prefix rewrites the URL of every config under it; "
            "one config takes a new URL, token or credentials"
        ),
    )
    move_from = forms.CharField(
        required=False,
        max_length=2048,
        label="old URL prefix",
        widget=URL_INPUT,
        help_text="every config whose URL starts with it moves, e.g. https://hooks.example/v1/",
    )
    move_to = forms.CharField(
        required=False,
        max_length=2048,
        label="new URL prefix",
        widget=URL_INPUT,
        help_text="replaces the old prefix, the rest of each URL kept",
    )
    move_origin = forms.CharField(
        required=False,
        max_length=300,
        label="only on origin",
        widget=URL_INPUT,
        help_text="optional: only configs on this origin (https://host[:port])",
    )
    task_id = forms.CharField(
        required=False,
        label="task id (one config)",
        widget=forms.TextInput(attrs={"size": 40}),
        help_text="the task whose config changes",
    )
    config_id = forms.CharField(
        required=False,
        label="config id (one config)",
        help_text="the push config's id, as the client registered it",
    )
    new_url = forms.CharField(
        required=False,
        max_length=2048,
        label="the config's new URL",
        widget=URL_INPUT,
        help_text="empty: the URL stays",
    )
    new_token = forms.CharField(
        required=False,
        max_length=1024,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        label="the config's new token",
        help_text="sent as X-A2A-Notification-Token; never shown again",
    )
    new_auth_scheme = forms.CharField(
        required=False, max_length=64, label="its new auth scheme", help_text="e.g. Bearer"
    )
    new_credentials = forms.CharField(
        required=False,
        max_length=4096,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        label="its new credentials",
        help_text=(
            "with the scheme: sent as Authorization: <scheme> <credentials>. The token and "
            "the credentials are replaced together: one left empty is removed"
        ),
    )
    remove_credentials = forms.BooleanField(
        required=False,
        label="remove the config's token and credentials",
        help_text="the new channel sends neither",
    )
    # The confirmation step's copy of the two secrets above (seal_secrets).
    sealed_secrets = forms.CharField(required=False, widget=forms.HiddenInput)
    policy = forms.ChoiceField(
        choices=[("", "the agent's declared policy"), *PushChannelPolicy.choices],
        required=False,
        help_text=(
            "drain: each task in flight gets a notice on its old channel and moves once it is "
            "delivered; cutover: the old channel stops now and tasks still on it are orphaned"
        ),
    )
    finish_on_old = forms.BooleanField(
        required=False,
        label="let in-flight tasks finish on the old channel",
        help_text="only new tasks use the new channel; those in flight end where they started",
    )
    deadline = forms.CharField(
        required=False,
        help_text="how long a drain may take: 90s, 15m, 1h, 2d (empty: the agent's)",
    )
    on_timeout = forms.ChoiceField(
        choices=[("", "the agent's declared action"), *OnDrainTimeout.choices],
        required=False,
        help_text="at the deadline: cut over what is left, or extend the deadline once",
    )
    at = forms.DateTimeField(
        required=False,
        label="start at (empty: now)",
        help_text="ISO 8601, e.g. 2026-12-24T02:00:00+00:00",
    )
    reason = forms.CharField(
        required=False,
        max_length=500,
        widget=URL_INPUT,
        help_text="kept with the rebind and its audit row",
    )
    force = forms.BooleanField(
        required=False,
        label="even over an open rebind of that scope",
        help_text="the open rebind is superseded; without it the start is refused",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # One agent: it is the one (a link from an agent's page names it already).
        if "agent" not in self.initial:
            slugs = list(self.fields["agent"].queryset.values_list("slug", flat=True)[:2])
            if len(slugs) == 1:
                self.initial["agent"] = slugs[0]

    def sections(self) -> list[tuple[str, str | None, list[forms.BoundField]]]:
        """The visible fields by section (SECTIONS), in order."""
        return [(title, op, [self[name] for name in names]) for title, op, names in self.SECTIONS]

    def clean_deadline(self) -> int | None:
        text = self.cleaned_data["deadline"].strip()
        if not text:
            return None
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self):
        """Which operations are asked for, each with its input; the values themselves are the
        pre-checks' (`refused`)."""
        data = super().clean()
        ops = set(data.get("operations") or [])
        agent = data.get("agent")
        if "move_prefix" in ops and not (data.get("move_from") or data.get("move_to")):
            self.add_error("move_from", "moving a prefix needs the old and the new prefix")
        data["config"] = None
        if "config" in ops and agent is not None:
            try:
                data["config"] = agent_push_config(
                    agent, data.get("task_id") or "", data.get("config_id") or ""
                )
            except RebindInvalid as exc:
                self.refused(exc)
        self._clean_secrets(data, "config" in ops)
        return data

    def refused(self, exc: RebindInvalid) -> None:
        """A pre-check's refusal, in its words, on the field it names."""
        self.add_error(REFUSED_FIELD.get(exc.field), f"{exc.field}: {exc.description}")

    def _clean_secrets(self, data: dict, one_config: bool) -> None:
        """The new token and credentials: typed now, or carried sealed from the first step."""
        token, credentials = data.get("new_token") or "", data.get("new_credentials") or ""
        sealed = data.get("sealed_secrets") or ""
        if sealed and one_config and not (token or credentials):
            try:
                token, credentials = unseal_secrets(sealed)
            except ValueError as exc:
                self.add_error("new_token", f"{exc}: type them again")
                return
        data["new_token"], data["new_credentials"] = token, credentials
        scheme = data.get("new_auth_scheme") or ""
        removing = data.get("remove_credentials")
        given = [
            name
            for name, value in (
                ("new_url", data.get("new_url")),
                ("new_token", token),
                ("new_auth_scheme", scheme),
                ("new_credentials", credentials),
                ("remove_credentials", removing),
            )
            if value
        ]
        # Without the config operation, what was typed still goes to the request: the
        # pre-check refuses it there (a URL or credentials without the config they replace).
        if one_config and not given:
            self.add_error("new_url", "give the config's new URL, token or credentials")
            return
        if removing:
            for name in ("new_token", "new_auth_scheme", "new_credentials"):
                if name in given:
                    self.add_error(name, "leave it empty to remove the token and credentials")

    @property
    def replaces_credentials(self) -> bool:
        data = self.cleaned_data
        return bool(
            data.get("remove_credentials")
            or data.get("new_token")
            or data.get("new_auth_scheme")
            or data.get("new_credentials")
        )

    def secrets_summary(self) -> list[str]:
        """What happens to the config's token and credentials, without either of them."""
        data = self.cleaned_data
        if "config" not in set(data.get("operations") or []):
            return []
        if not self.replaces_credentials:
            return ["token and credentials: kept"]
        scheme = data.get("new_auth_scheme")
        return [
            "new token: set" if data.get("new_token") else "token: removed",
            f"credentials: replaced ({scheme})" if scheme else "credentials: removed",
        ]

    def carried_fields(self) -> list[forms.BoundField]:
        """The fields the confirmation step posts back as they are: all but the secrets."""
        skip = {"new_token", "new_credentials", "sealed_secrets"}
        return [field for field in self if field.name not in skip]

    def sealed(self) -> str:
        """The confirmation step's sealed copy of the new token and credentials ("" when
        there is none)."""
        data = self.cleaned_data
        if not (data.get("new_token") or data.get("new_credentials")):
            return ""
        return seal_secrets(data["new_token"], data["new_credentials"])

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
            config=data["config"],
            new_url=data["new_url"],
            # RebindRequest: None keeps the token and credentials; else all are replaced.
            new_token=data["new_token"] if self.replaces_credentials else None,
            new_auth_scheme=data["new_auth_scheme"] if self.replaces_credentials else None,
            new_credentials=data["new_credentials"] if self.replaces_credentials else "",
            policy=data["policy"] or None,
            finish_on_old=data["finish_on_old"],
            deadline_seconds=data["deadline"],
            on_timeout=data["on_timeout"] or None,
            at=data["at"],
            reason=data["reason"],
            force=data["force"],
            preview_refuses_unsafe=False,  # the confirmation page lists it as a failed check
        )
