"""What ``render``/``messages`` return with ``route=True``: the request built here and the vLLM endpoint the service's
``POST /prefixes/{name}/route`` chose for it (issue 30: the replica holding the prefix, else the cheapest to warm)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragcache.errors import InvalidInputError


@dataclass(frozen=True)
class RoutedPrompt:
    """A prompt from ``render(name, route=True)`` and where to send it: ``endpoint`` (a vLLM base URL) and
    ``reason`` (``resident``, ``least_cost``, ``least_load`` or ``round_robin``, as the route answer names it)."""

    prompt: str
    endpoint: str
    reason: str


@dataclass(frozen=True)
class RoutedMessages:
    """Chat messages from ``messages(name, user, route=True)`` and where to send them (as :class:`RoutedPrompt`)."""

    messages: list[dict[str, str]]
    endpoint: str
    reason: str


def check_route_flag(route: object) -> bool:
    """``route`` is the routing switch, never a template slot: a non-bool (a slot of that name) is refused, not
    taken for True."""
    if not isinstance(route, bool):
        raise InvalidInputError("route= is render's routing switch (True or False), not a template slot; "
                                "rename the slot", field="route")
    return route


def route_fields(answer: dict[str, Any]) -> dict[str, str]:
    """The endpoint and reason of a ``POST /prefixes/{name}/route`` answer."""
    return {"endpoint": answer["endpoint"], "reason": answer["reason"]}
