"""The operators' permission groups, kept in step with the code after every `migrate`
(idempotent: a group is created if missing and given exactly its permissions):

- `viewer`: sees everything in the console (view permissions), changes nothing;
- `operator`: also pauses and resumes endpoints, resolves alerts, replays deliveries and
  advances rebinds (the change permissions the admin's actions ask for);
- `rebind operator`: also starts, cuts over, extends and aborts rebinds (`run_rebind`).

Give staff users one of these instead of piecemeal permissions (docs/rebinds.md).
"""

from __future__ import annotations

VIEWED = [
    ("agents", "agent"),
    ("agents", "apikey"),
    ("agents", "signingkey"),
    ("agents", "cardversion"),
    ("agents", "workerheartbeat"),
    ("agents", "operatoraction"),  # the audit (its table is still webhooks_operatoraction)
    ("tasks", "task"),
    ("webhooks", "delivery"),
    ("webhooks", "deliveryattempt"),  # a delivery's attempt timeline (an inline)
    ("webhooks", "endpoint"),
    ("webhooks", "pushconfig"),
    ("webhooks", "pushbinding"),  # a push config's versions (an inline)
    ("webhooks", "alert"),
    ("webhooks", "rebind"),
    ("webhooks", "channelmove"),
]
OPERATED = [
    ("webhooks", "delivery"),
    ("webhooks", "endpoint"),
    ("webhooks", "alert"),
    ("webhooks", "rebind"),
]

GROUPS: dict[str, list[tuple[str, str]]] = {
    "viewer": [(app, f"view_{model}") for app, model in VIEWED],
    "operator": [(app, f"view_{model}") for app, model in VIEWED]
    + [(app, f"change_{model}") for app, model in OPERATED],
}
GROUPS["rebind operator"] = [*GROUPS["operator"], ("webhooks", "run_rebind")]


def sync_groups(**_) -> None:
    """Create or update the three groups (a post_migrate receiver)."""
    from django.contrib.auth.models import Group, Permission

    known = {
        (app, codename): pk
        for pk, app, codename in Permission.objects.filter(
            content_type__app_label__in={app for group in GROUPS.values() for app, _ in group}
        ).values_list("pk", "content_type__app_label", "codename")
    }
    for name, wanted in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set([known[key] for key in wanted if key in known])
