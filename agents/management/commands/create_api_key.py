from django.core.management.base import BaseCommand, CommandError

from agents.models import Agent, ApiKeyKind
from agents.services import AgentError, api_key_create


class Command(BaseCommand):
    help = "Create an API key for an agent. The token is printed once and never stored."

    def add_arguments(self, parser):
        parser.add_argument("slug", help="the agent's slug")
        parser.add_argument("--name", required=True, help="who or what the key is for")
        parser.add_argument("--kind", choices=ApiKeyKind.values, default=ApiKeyKind.CLIENT)

    def handle(self, *args, **opts):
        agent = Agent.objects.filter(slug=opts["slug"]).first()
        if agent is None:
            raise CommandError(f"no agent with slug {opts['slug']!r}")
        try:
            new = api_key_create(agent=agent, name=opts["name"], kind=opts["kind"], actor="cli")
        except AgentError as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(
            f"{new.key.kind} key {new.key.prefix} for agent {agent.slug}; "
            "store the token now, it is not shown again:"
        )
        self.stdout.write(new.token)
