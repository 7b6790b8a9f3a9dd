"""The management REST API (`/api/v1/`, docs/api.md): an interface layer beside
a2a_platform.protocol. Thin views over the apps' services and selectors; its own models are
the integrators' tokens and the Idempotency-Key claims."""
