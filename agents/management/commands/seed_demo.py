import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from agents.models import Agent
from agents.services import agent_create

DEMO_SKILLS = [
    {
        "id": "scripted-demo",
        "name": "Scripted demo",
        "description": (
            "Echoes plain messages; runs scripts such as 'work 3; chunks 5; ask' "
            "(see docs/executors.md)."
        ),
        "tags": ["demo", "echo"],
        "examples": ["hello", "work 2; chunks 3", "ask"],
    }
]


class Command(BaseCommand):
    help = (
        "Idempotent demo data: the public default agent `demo` (scripted executor) and an "
        "admin login (A2A_ADMIN_USER / A2A_ADMIN_PASSWORD, or a generated password printed once)."
    )

    def handle(self, *args, **opts):
        if not Agent.objects.filter(slug="demo").exists():
            agent_create(
                slug="demo",
                name="Demo agent",
                description="A public demo agent driven by the deterministic scripted executor.",
                executor="scripted",
                is_default=not Agent.objects.filter(is_default=True).exists(),
                skills=DEMO_SKILLS,
                # It echoes back whatever parts it is sent (docs/executors.md).
                default_input_modes=["*/*"],
                default_output_modes=["*/*"],
                provider_organization="A2A Platform",
                provider_url="https://example.org/a2a-platform",
            )
            self.stdout.write("created the demo agent `demo` (public, scripted, default)")
        else:
            self.stdout.write("demo agent `demo` already exists")

        self._admin_login()

    def _admin_login(self) -> None:
        """The admin login: created once; A2A_ADMIN_PASSWORD, when set, is the password
        (set again on every run, so setting it later resets it). A generated password is
        printed and kept in var/admin-login.txt (owner-only), so it can be found again."""
        User = get_user_model()
        username = os.environ.get("A2A_ADMIN_USER", "admin")
        from_env = os.environ.get("A2A_ADMIN_PASSWORD")
        login_file = Path(settings.VAR_DIR) / "admin-login.txt"
        reset_hint = (
            f"reset it with `.venv/bin/python manage.py changepassword {username}` or by "
            "running again with A2A_ADMIN_PASSWORD set"
        )
        user = User.objects.filter(username=username).first()
        if user is not None:
            if from_env:
                user.set_password(from_env)
                user.save(update_fields=["password"])
                self.stdout.write(
                    f"admin login: user `{username}`, password from A2A_ADMIN_PASSWORD"
                )
                return
            where = f"; the generated one is in {login_file}" if login_file.exists() else ""
            self.stdout.write(
                f"admin user `{username}` already exists (password unchanged{where}); {reset_hint}"
            )
            return
        password = from_env or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        if from_env:
            self.stdout.write(f"admin login: user `{username}`, password from A2A_ADMIN_PASSWORD")
            return
        login_file.write_text(f"user: {username}\npassword: {password}\n")
        login_file.chmod(0o600)
        self.stdout.write(
            f"admin login: user `{username}`, password {password} (also in {login_file}); "
            f"{reset_hint}"
        )
