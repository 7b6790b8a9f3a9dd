"""The operator console's pages of webhook delivery, one module per model family: deliveries
with their attempt timeline (`deliveries`), endpoints (`endpoints`), push configs with their
binding versions and the task page's channel history (`push_configs`), rebinds with their moves
(`rebinds`), alerts and the operator actions' log (`audit`); what they share in `display`.
Importing the package registers them all (Django's admin autodiscover imports `webhooks.admin`).
"""

from webhooks.admin import audit, deliveries, endpoints, push_configs, rebinds

__all__ = ["audit", "deliveries", "endpoints", "push_configs", "rebinds"]
