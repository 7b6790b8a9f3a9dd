from django.core.management.base import BaseCommand, CommandError

from agents.models import AuthMode, Executor
from agents.services import AgentError, agent_create


class Command(BaseCommand):
    help = "Create an agent (a tenant served at /<slug>/)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)
        parser.add_argument("--description", required=True)
        # Not `choices=`: hosted code, `python:<module>:<attribute>`, is an executor too; the
        # service refuses a bad value with agents.executor_spec's words.
        parser.add_argument(
            "--executor",
            default=Executor.ECHO,
            help="echo, scripted, conformance, external, or python:<module>:<attribute>",
        )
        parser.add_argument("--auth", choices=AuthMode.values, default=AuthMode.PUBLIC)
        # Not --version: BaseCommand owns that flag (it prints Django's version).
        parser.add_argument("--agent-version", dest="agent_version", default="1.0.0")
        parser.add_argument("--default", action="store_true", help="also serve at the root")

    def handle(self, *args, **opts):
        try:
            agent = agent_create(
                slug=opts["slug"],
                name=opts["name"],
                description=opts["description"],
                executor=opts["executor"],
                auth_mode=opts["auth"],
                is_default=opts["default"],
                version=opts["agent_version"],
                actor="cli",
            )
        except AgentError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"created agent {agent.slug} (executor {agent.executor})")
