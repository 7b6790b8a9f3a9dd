"""Example agents the platform hosts (docs/agents.md): each written only against a2a-sdk's
public API, unchanged from how the SDK's own server would host it."""
