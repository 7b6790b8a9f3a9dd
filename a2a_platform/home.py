"""The landing page at `/`: what runs here and where everything is (GET only)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from agents.selectors import agents_served


@require_safe
def home(request: HttpRequest) -> HttpResponse:
    """Links for a newcomer: each agent's card and endpoints, the admin, the APIs, health."""
    base = request.build_absolute_uri("/").rstrip("/")
    agents = [
        {
            "agent": agent,
            "url": f"{base}/{agent.slug}",
            "card": f"/{agent.slug}/.well-known/agent-card.json",
            "jwks": f"/{agent.slug}/.well-known/jwks.json",
        }
        for agent in agents_served()
    ]
    return render(request, "home.html", {"agents": agents, "base": base})
