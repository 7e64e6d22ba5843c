"""Client side of the KV-prefix registry: its HTTP operations, and ``render`` done locally.

Each operation is described once as a :class:`PrefixCall` (method, path, body, how to read the answer);
:class:`PrefixClient` sends them over an ``httpx.Client`` and :class:`AsyncPrefixClient` over an
``httpx.AsyncClient``, so the two cannot drift apart. ``render``/``messages`` fetch the prefix once
(refreshed every ``refresh_s``), build the prompt locally, byte for byte prefix-first, and report the
number of uses to the service in batches (on refresh, or :meth:`flush_uses`).

Errors: 404 -> NotFoundError, 400/422 -> InvalidInputError, anything else failed -> RagCacheError.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ragcache.errors import InvalidInputError, NotFoundError, RagCacheError
from ragcache.prefixes.model import Prefix, PromptForm, Target
from ragcache.prefixes.text import render_messages, render_text

__all__ = ["PrefixCall", "PrefixClient", "AsyncPrefixClient"]


@dataclass(frozen=True)
class PrefixCall:
    method: str
    path: str
    body: Any
    parse: Callable[[Any], Any]  # decoded JSON answer (None for 204) -> the operation's value


def _identity(data: Any) -> Any:
    return data


def register_call(name: str, text: str, target: Target, *, is_template: bool = False,
                  form: PromptForm = PromptForm.COMPLETION, lmcache_controller_url: str | None = None,
                  pinned: bool = True) -> PrefixCall:
    body = {"name": name, "text": text, "target": {"base_url": target.base_url, "model": target.model},
            "is_template": is_template, "form": PromptForm(form).value,
            "lmcache_controller_url": lmcache_controller_url, "pinned": pinned}
    return PrefixCall("POST", "/prefixes", body, _identity)


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        message = response.json().get("error", {}).get("message") or response.text
    except ValueError:
        message = response.text
    if response.status_code == 404:
        raise NotFoundError(message)
    if response.status_code in (400, 422):
        raise InvalidInputError(message)
    raise RagCacheError(f"prefix service answered {response.status_code}: {message}")


def _decode(response: httpx.Response, call: PrefixCall) -> Any:
    _raise_for(response)
    return call.parse(response.json() if response.status_code != 204 and response.content else None)


class _PrefixOperations:
    """The operations, written once; subclasses only send."""

    def _call(self, call: PrefixCall) -> Any:
        raise NotImplementedError

    def register_prefix(self, name: str, text: str, target: Target, **options: Any) -> Any:
        """POST /prefixes: returns the service's answer (prefix, warnings, first warm)."""
        return self._call(register_call(name, text, target, **options))

    def list_prefixes(self) -> Any:
        return self._call(PrefixCall("GET", "/prefixes", None, lambda d: [Prefix.from_json(p) for p in d]))

    def get_prefix(self, name: str) -> Any:
        return self._call(PrefixCall("GET", f"/prefixes/{name}", None, Prefix.from_json))

    def delete_prefix(self, name: str) -> Any:
        return self._call(PrefixCall("DELETE", f"/prefixes/{name}", None, _identity))

    def warm_prefix(self, name: str) -> Any:
        return self._call(PrefixCall("POST", f"/prefixes/{name}/warm", None, _identity))

    def prefix_stats(self, name: str) -> Any:
        return self._call(PrefixCall("GET", f"/prefixes/{name}/stats", None, _identity))

    def report_uses(self, name: str, count: int) -> Any:
        return self._call(PrefixCall("POST", f"/prefixes/{name}/uses", {"count": count}, _identity))


class _RenderCache:
    """Fetched prefixes (by name, with fetch time) and the uses not yet reported."""

    def __init__(self, refresh_s: float, clock: Callable[[], float]) -> None:
        self.refresh_s = refresh_s
        self.clock = clock
        self.prefixes: dict[str, tuple[Prefix, float]] = {}
        self.pending_uses: collections.Counter[str] = collections.Counter()

    def fresh(self, name: str) -> Prefix | None:
        entry = self.prefixes.get(name)
        return entry[0] if entry and self.clock() - entry[1] < self.refresh_s else None


class PrefixClient(_PrefixOperations):
    """Blocking client over an ``httpx.Client`` whose ``base_url`` is the ragcache service."""

    def __init__(self, http: httpx.Client, *, refresh_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self._http = http
        self._cache = _RenderCache(refresh_s, clock)

    def _call(self, call: PrefixCall) -> Any:
        try:
            response = self._http.request(call.method, call.path, json=call.body)
        except httpx.HTTPError as exc:
            raise RagCacheError(f"prefix service unreachable: {exc}") from exc
        return _decode(response, call)

    def _prefix(self, name: str) -> Prefix:
        prefix = self._cache.fresh(name)
        if prefix is None:
            self.flush_uses()
            prefix = self.get_prefix(name)
            self._cache.prefixes[name] = (prefix, self._cache.clock())
        self._cache.pending_uses[name] += 1
        return prefix

    def render(self, name: str, **slots: Any) -> str:
        """The prompt for prefix ``name``, built locally: the prefix first, byte for byte."""
        return render_text(self._prefix(name), slots)

    def messages(self, name: str, user: str, **slots: Any) -> list[dict[str, str]]:
        """Chat form: the rendered prefix as the system message, then ``user``."""
        return render_messages(self._prefix(name), user, slots)

    def flush_uses(self) -> None:
        """Report the uses counted since the last report."""
        pending, self._cache.pending_uses = self._cache.pending_uses, collections.Counter()
        for name, count in pending.items():
            self.report_uses(name, count)


class AsyncPrefixClient(_PrefixOperations):
    """The same operations over an ``httpx.AsyncClient``; each method returns an awaitable."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def _call(self, call: PrefixCall) -> Any:
        try:
            response = await self._http.request(call.method, call.path, json=call.body)
        except httpx.HTTPError as exc:
            raise RagCacheError(f"prefix service unreachable: {exc}") from exc
        return _decode(response, call)

    async def render(self, name: str, **slots: Any) -> str:
        """Fetch the prefix and render locally (no caching here: keep the fetched :class:`Prefix`
        and call :func:`ragcache.prefixes.render_text` to render many prompts from one fetch)."""
        prefix = await self.get_prefix(name)
        await self.report_uses(name, 1)
        return render_text(prefix, slots)
