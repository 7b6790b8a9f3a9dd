"""`manage.py create_api_token USER --name NAME --scope read|operate|rebind [--expires-in 30d]`:
an integrator's token acting as USER; the secret is printed once."""

from __future__ import annotations

import datetime as dt

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from a2a_platform.api.models import TokenScope
from a2a_platform.api.services import TokenRefused, api_token_create


class Command(BaseCommand):
    help = "Create a management API token for a user (printed once; only its digest is kept)."

    def add_arguments(self, parser):
        parser.add_argument("user", help="username the token acts as")
        parser.add_argument("--name", required=True, help="who or what the token is for")
        parser.add_argument("--scope", required=True, choices=TokenScope.values)
        parser.add_argument("--expires-in-days", type=int, default=None)

    def handle(self, *args, **opts):
        user = get_user_model().objects.filter(username=opts["user"]).first()
        if user is None:
            raise CommandError(f"no user {opts['user']!r}")
        days = opts["expires_in_days"]
        if days is not None and days < 1:
            raise CommandError("--expires-in-days must be at least 1")
        expires = timezone.now() + dt.timedelta(days=days) if days else None
        try:
            new = api_token_create(
                name=opts["name"],
                scope=opts["scope"],
                user=user,
                created_by=None,
                expires_at=expires,
            )
        except TokenRefused as exc:
            raise CommandError(f"{exc.field}: {exc}") from None
        self.stderr.write(
            f"token {new.token.prefix} ({new.token.scope}) for {user.get_username()}; "
            "the secret below is shown once:"
        )
        self.stdout.write(new.secret)
