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


class RebindInvalid(WebhookError):
    """A rebind request that cannot be run as given (unknown agent, a prefix matching no
    config, a deadline in the past, an unsafe URL, ...): nothing was changed. `field` names
    the offending input, as InvalidPayload does."""

    def __init__(self, field: str, description: str) -> None:
        self.field = field
        self.description = description
        super().__init__(f"{field}: {description}")


class RebindConflict(WebhookError):
    """Another open rebind covers the same scope; refused unless forced."""

    def __init__(self, other_pk: object, overlap: str) -> None:
        self.other_pk = other_pk
        self.overlap = overlap
        super().__init__(
            f"rebind {other_pk} is still open over the same scope ({overlap}); "
            "finish, cut over or abort it first, or force this one"
        )


class RebindNotFound(WebhookError):
    def __init__(self, pk: object) -> None:
        self.pk = pk
        super().__init__(f"no rebind {pk}")


class NoticeIncomplete(WebhookError):
    """A channel notice that a strict receiver could not use (no JWKS URL to name, no key for
    the new channel): it is never sent; the rebind stops (aborted) with this as its reason."""

    def __init__(self, config_id: str, missing: str) -> None:
        self.config_id = config_id
        self.missing = missing
        super().__init__(f"the notice for config {config_id} cannot be made complete: {missing}")
