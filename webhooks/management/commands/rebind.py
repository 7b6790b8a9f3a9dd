"""`manage.py rebind`: run a push-channel rebind from the shell (docs/rebinds.md).

Every subcommand calls one service of webhooks/rebinds/operations.py, the same ones the admin
console and the REST API call. Refusals print the reason and exit 2; nothing was changed.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agents.models import Agent
from webhooks.errors import RebindConflict, RebindInvalid, RebindNotFound
from webhooks.models import OPEN_REBIND_STATES, Rebind, RebindState
from webhooks.rebinds import operations as rebinds
from webhooks.rebinds.checks import RebindRequest
from webhooks.rebinds.forms import parse_duration
from webhooks.rebinds.machine import IllegalRebindTransition
from webhooks.selectors import agent_push_config, rebind_stragglers


def duration(text: str) -> int:
    """`90`, `90s`, `15m`, `1h`, `2d` → seconds."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def moment(text: str) -> datetime:
    """An ISO 8601 time with its offset, or `+15m` from now."""
    if text.startswith("+"):
        return timezone.now() + timedelta(seconds=duration(text[1:]))
    value = parse_datetime(text)
    if value is None or value.tzinfo is None:
        raise CommandError(f"{text!r} is not an ISO 8601 time with an offset, nor +<duration>")
    return value


SCOPES = {
    "start": "start a rebind of an agent's push channels now: a new signing key, new URLs or "
    "one config's new credentials",
    "schedule": "record a rebind that beat's rebind monitor starts at --at",
}
TAKES_A_REBIND = {
    "advance": "take a rebind as far as it can go now (what beat's rebind monitor does)",
    "cutover": "end a drain now: what is still on the old version is orphaned",
    "abort": "abort an open rebind: tasks not moved yet stay on the old channel",
    "rebind-orphans": "open the channels of a cut-over rebind's orphaned configs again",
}


class Command(BaseCommand):
    help = (
        "Run a two-phase push-channel rebind (docs/rebinds.md). "
        "`rebind SUBCOMMAND --help` describes each subcommand."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="SUBCOMMAND")

        def subcommand(name: str, text: str) -> CommandParser:
            # `help` is the line `rebind --help` lists; `description` heads `rebind NAME --help`.
            return sub.add_parser(name, help=text, description=text)

        for name, text in SCOPES.items():
            p = subcommand(name, text)
            p.add_argument("agent", help="the agent's slug")
            p.add_argument("--rotate-key", action="store_true", help="rotate the signing key")
            p.add_argument(
                "--move-prefix", nargs=2, metavar=("OLD", "NEW"), help="move URLs OLD… → NEW…"
            )
            p.add_argument("--origin", default="", help="only configs on this origin")
            p.add_argument(
                "--config", nargs=2, metavar=("TASK", "CONFIG"), help="one config of one task"
            )
            p.add_argument("--url", default="", help="the config's new URL (with --config)")
            p.add_argument("--token", default=None, help="the config's new token (with --config)")
            p.add_argument(
                "--auth-scheme", default=None, help="its new auth scheme (with --config)"
            )
            p.add_argument("--credentials", default="", help="its new credentials (with --config)")
            p.add_argument("--policy", choices=["drain", "cutover"], help="default: the agent's")
            p.add_argument("--deadline", type=duration, help="drain deadline (e.g. 1h)")
            p.add_argument(
                "--on-timeout",
                choices=["cutover", "extend"],
                help="at the deadline: cut over what is left, or extend once (default: agent's)",
            )
            p.add_argument(
                "--finish-on-old",
                action="store_true",
                help="drain: in-flight tasks stay on the old channel until they end",
            )
            p.add_argument("--reason", default="", help="why (audited)")
            p.add_argument("--force", action="store_true", help="even over an open rebind")
            p.add_argument("--actor", default="cli", help="who runs it (audited)")
            if name == "schedule":
                p.add_argument("--at", type=moment, required=True, help="ISO time or +15m")
            else:
                p.add_argument(
                    "--no-wait",
                    action="store_true",
                    help="return once the rebind is recorded, without waiting for a rotated "
                    "key to start signing (beat's rebind monitor takes it on)",
                )
        p = subcommand("show", "one rebind: its state, counts and the tasks on the old version")
        p.add_argument("rebind", help="the rebind's id")
        p.add_argument("--json", action="store_true", help="as JSON (states as stored)")
        p = subcommand("list", "rebinds, newest first, with when scheduled ones start")
        p.add_argument("--open", action="store_true", help="only open ones")
        for name, text in TAKES_A_REBIND.items():
            p = subcommand(name, text)
            p.add_argument("rebind", help="the rebind's id")
            p.add_argument("--actor", default="cli", help="who runs it (audited)")
            if name == "abort":
                # Required by the service (refused there, exit 2), as for every interface.
                p.add_argument("--reason", default="", help="why (an abort needs one)")
        p = subcommand("extend", "push a draining rebind's deadline back")
        p.add_argument("rebind", help="the rebind's id")
        p.add_argument("--by", type=duration, required=True, help="how much later (e.g. 30m)")
        p.add_argument("--actor", default="cli", help="who runs it (audited)")

    def handle(self, *args, **opts) -> None:
        action = opts["action"].replace("-", "_")
        try:
            getattr(self, f"_{action}")(opts)
        except (RebindInvalid, RebindConflict, RebindNotFound, IllegalRebindTransition) as exc:
            raise CommandError(str(exc), returncode=2) from None

    # --- subcommands ---------------------------------------------------------------------

    def _request(self, opts) -> RebindRequest:
        agent = Agent.objects.filter(slug=opts["agent"]).first()
        if agent is None:
            raise RebindInvalid("agent", f"no agent {opts['agent']!r}")
        config = agent_push_config(agent, *opts["config"]) if opts["config"] else None
        old, new = opts["move_prefix"] or ("", "")
        return RebindRequest(
            agent=agent,
            rotate_key=opts["rotate_key"],
            move_from=old,
            move_to=new,
            move_origin=opts["origin"],
            config=config,
            new_url=opts["url"],
            new_token=opts["token"],
            new_auth_scheme=opts["auth_scheme"],
            new_credentials=opts["credentials"],
            policy=opts["policy"],
            finish_on_old=opts["finish_on_old"],
            deadline_seconds=opts["deadline"],
            on_timeout=opts["on_timeout"],
            at=opts.get("at"),
            reason=opts["reason"],
            force=opts["force"],
        )

    def _start(self, opts) -> None:
        rebind = rebinds.rebind_start(self._request(opts), actor=opts["actor"])
        self.stdout.write(str(rebind.pk))
        if rebind.state == RebindState.PREPARING and opts["no_wait"]:
            self.stderr.write(_summary(rebind))
            self.stderr.write(
                f"new key {rebind.new_key.kid} is in the JWKS; it signs from "
                f"{_when(rebind.activate_key_at)}, when beat's rebind monitor starts the drain. "
                f"Follow it: manage.py rebind show {rebind.pk}"
            )
            return
        if rebind.state == RebindState.PREPARING:
            wait = (rebind.activate_key_at - timezone.now()).total_seconds()
            self.stderr.write(
                f"new key {rebind.new_key.kid} is in the JWKS; it signs in {wait:.0f}s "
                "(the minimum overlap)"
            )
            while rebind.state == RebindState.PREPARING:
                time.sleep(min(1.0, max(0.05, wait)))
                rebind = rebinds.rebind_advance(rebind.pk)
        self.stderr.write(_summary(rebind))

    def _schedule(self, opts) -> None:
        rebind = rebinds.rebind_start(self._request(opts), actor=opts["actor"])
        self.stdout.write(str(rebind.pk))
        self.stderr.write(_summary(rebind))

    def _show(self, opts) -> None:
        rebind = rebinds.rebind_get(opts["rebind"])
        stragglers = rebind_stragglers(rebind)
        if opts["json"]:
            self.stdout.write(
                json.dumps({**_as_dict(rebind), "onOldVersion": stragglers}, default=str, indent=2)
            )
            return
        self.stdout.write(_summary(rebind))
        for key, value in {**_as_dict(rebind), "state": rebind.get_state_display()}.items():
            self.stdout.write(f"  {key}: {value}")
        if stragglers:
            self.stdout.write(f"tasks on the old version ({len(stragglers)} shown):")
            for s in stragglers:
                self.stdout.write(
                    f"  {s['task']}  {s['state']:<15} {s['version']:<24} notice {s['notice']}"
                    + (f" ({s['noticeError']})" if s["noticeError"] else "")
                )

    def _list(self, opts) -> None:
        query = Rebind.objects.select_related("agent").order_by("-created_at")
        if opts["open"]:
            query = query.filter(state__in=OPEN_REBIND_STATES)
        for rebind in query[:200]:
            self.stdout.write(_summary(rebind))

    def _advance(self, opts) -> None:
        self.stdout.write(_summary(rebinds.rebind_advance(opts["rebind"])))

    def _cutover(self, opts) -> None:
        self.stdout.write(_summary(rebinds.rebind_cutover(opts["rebind"], actor=opts["actor"])))

    def _extend(self, opts) -> None:
        rebind = rebinds.rebind_extend(opts["rebind"], seconds=opts["by"], actor=opts["actor"])
        self.stdout.write(_summary(rebind))

    def _abort(self, opts) -> None:
        rebind = rebinds.rebind_abort(opts["rebind"], actor=opts["actor"], reason=opts["reason"])
        self.stdout.write(_summary(rebind))

    def _rebind_orphans(self, opts) -> None:
        count = rebinds.rebind_orphans(opts["rebind"], actor=opts["actor"])
        self.stdout.write(f"re-bound {count} orphaned config(s)")


def _summary(rebind: Rebind) -> str:
    counts = rebind.counts or {}
    scope = ", ".join(
        part
        for part in (
            "rotate key" if rebind.rotate_key else "",
            f"{rebind.move_from} → {rebind.move_to}" if rebind.move_from else "",
            f"config {rebind.config_id}" if rebind.config_id else "",
        )
        if part
    )
    state = rebind.get_state_display()
    if rebind.state == RebindState.SCHEDULED:
        state += f", starts {_when(rebind.scheduled_for)}"
    return (
        f"rebind {rebind.pk} [{rebind.agent.slug}] {state} ({rebind.policy}; {scope}): "
        f"{counts.get('onOldVersionTotal', 0)} on old, {counts.get('moved', 0)} moved, "
        f"{counts.get('orphaned', 0)} orphaned, notices {counts.get('notices', {})}"
    )


def _when(moment: datetime) -> str:
    """An exact UTC time and how far it is from now, as an operator reads it."""
    seconds = round((moment - timezone.now()).total_seconds())
    away = f"in {seconds}s" if seconds >= 0 else f"{-seconds}s ago"
    return f"{moment.astimezone(UTC).isoformat(timespec='seconds')} ({away})"


def _as_dict(rebind: Rebind) -> dict:
    return {
        "id": str(rebind.pk),
        "agent": rebind.agent.slug,
        "state": rebind.state,
        "policy": rebind.policy,
        "finishOnOld": rebind.finish_on_old,
        "rotateKey": rebind.rotate_key,
        "movePrefix": [rebind.move_from, rebind.move_to] if rebind.move_from else None,
        "deadline": rebind.deadline,
        "onTimeout": rebind.on_timeout,
        "actor": rebind.actor,
        "reason": rebind.reason,
        "createdAt": rebind.created_at,
        "startedAt": rebind.started_at,
        "finishedAt": rebind.finished_at,
        "scheduledFor": rebind.scheduled_for,
        "oldKeyRetireAfter": rebind.old_key_retire_after,
        "counts": rebind.counts,
    }
