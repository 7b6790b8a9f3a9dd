from django.core.management.base import BaseCommand
from django.db.models import Count, Q

from agents.models import Agent


class Command(BaseCommand):
    help = "List agents with their executor, auth mode and key counts."

    def handle(self, *args, **opts):
        # Meta.ordering does not apply to GROUP BY queries: order explicitly.
        agents = Agent.objects.annotate(
            live_keys=Count("api_keys", filter=Q(api_keys__revoked_at__isnull=True))
        ).order_by("slug")
        rows = [("slug", "name", "executor", "auth", "default", "enabled", "keys")]
        for a in agents:
            rows.append(
                (
                    a.slug,
                    a.name,
                    a.executor,
                    a.auth_mode,
                    "yes" if a.is_default else "",
                    "yes" if a.enabled else "no",
                    str(a.live_keys),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
