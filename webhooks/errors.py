"""Domain errors of the webhooks services; the protocol and API layers map them."""

from __future__ import annotations


class WebhookError(Exception):
    """Base class of the webhooks services' refusals."""


class PushNotSupported(WebhookError):
    """The agent's push notifications are switched off: registering is refused for good."""

    def __init__(self, agent_slug: str) -> None:
        self.agent_slug = agent_slug
        super().__init__("this agent does not offer push notifications")


class PushDeliveryUnavailable(WebhookError):
    """No delivery worker is live right now: a registration would not be delivered yet, so it
    is refused; retryable after `retry_after` seconds."""

    def __init__(self, retry_after: int) -> None:
        self.retry_after = retry_after
        super().__init__("no webhook delivery worker is live right now; retry shortly")
