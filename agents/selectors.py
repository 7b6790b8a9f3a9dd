"""Reads of the agents app."""

from __future__ import annotations

from agents.models import Agent


def agent_by_slug(slug: str) -> Agent | None:
    return Agent.objects.filter(slug=slug, enabled=True).first()


def default_agent() -> Agent | None:
    return Agent.objects.filter(is_default=True, enabled=True).first()


def agents_served() -> list[Agent]:
    """The enabled agents, the default one first: what the landing page lists."""
    return list(Agent.objects.filter(enabled=True).order_by("-is_default", "slug"))
