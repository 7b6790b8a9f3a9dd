import os
import secrets

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
                provider_organization="A2A Platform",
                provider_url="https://example.org/a2a-platform",
            )
            self.stdout.write("created the demo agent `demo` (public, scripted, default)")
        else:
            self.stdout.write("demo agent `demo` already exists")

        User = get_user_model()
        username = os.environ.get("A2A_ADMIN_USER", "admin")
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"admin user `{username}` already exists (password unchanged)")
            return
        password = os.environ.get("A2A_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        shown = "from A2A_ADMIN_PASSWORD" if os.environ.get("A2A_ADMIN_PASSWORD") else password
        self.stdout.write(f"admin login: user `{username}`, password {shown} (shown once)")
