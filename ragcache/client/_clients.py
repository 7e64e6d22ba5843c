"""The two clients over ``_Operations``: ``Client`` sends each call with a blocking httpx client,
``AsyncClient`` with an asyncio one; both keep registered prefixes for local prompt building."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterable
from typing import Any, Literal, overload

import httpx

from ragcache.client._operations import _Operations
from ragcache.client._routed import RoutedMessages, RoutedPrompt, check_route_flag, route_fields
from ragcache.client._wire import _Call, _with_chunks
from ragcache.prefixes.model import Prefix
from ragcache.prefixes.text import Chunk, assemble_prompt, render_messages, render_text


class Client(_Operations):
    """A blocking client. Thread-safe (one connection pool); close it, or use it as a context manager."""

    _http_class = httpx.Client

    def _call(self, call: _Call) -> Any:
        for attempt in itertools.count():
            try:
                outcome = self._http.request(call.method, call.path, json=call.body)
            except (httpx.HTTPError, TypeError, ValueError) as exc:
                outcome = exc
            delay, value = self._settle(call, attempt, outcome)
            if delay is None:
                return value
            time.sleep(delay)

    @overload
    def render(self, name: str, *, chunks: Iterable[Chunk] = (), volatile: str = "", route: Literal[False] = False,
               **slots: Any) -> str: ...

    @overload
    def render(self, name: str, *, chunks: Iterable[Chunk] = (), volatile: str = "", route: Literal[True],
               **slots: Any) -> RoutedPrompt: ...

    def render(self, name: str, *, chunks: Iterable[Chunk] = (), volatile: str = "", route: bool = False,
               **slots: Any) -> str | RoutedPrompt:
        """The prompt for prefix ``name``, built here: its text (``slots`` filled into a template), then
        ``chunks`` (search hits) by id, then ``volatile`` (the question, a date) last, so consecutive requests
        share the longest possible prefix in vLLM's cache (:func:`ragcache.prefixes.assemble_prompt`).
        ``route=True``: a :class:`RoutedPrompt`, the prompt with the vLLM endpoint to send it to, asked of
        ``POST /prefixes/{name}/route`` (one more call each time: a route is chosen per request)."""
        check_route_flag(route)
        prompt = assemble_prompt(render_text(self._prefix(name), slots), chunks, volatile)
        return RoutedPrompt(prompt, **route_fields(self.route_prefix(name))) if route else prompt

    @overload
    def messages(self, name: str, user: str, *, chunks: Iterable[Chunk] = (), route: Literal[False] = False,
                 **slots: Any) -> list[dict[str, str]]: ...

    @overload
    def messages(self, name: str, user: str, *, chunks: Iterable[Chunk] = (), route: Literal[True],
                 **slots: Any) -> RoutedMessages: ...

    def messages(self, name: str, user: str, *, chunks: Iterable[Chunk] = (), route: bool = False,
                 **slots: Any) -> list[dict[str, str]] | RoutedMessages:
        """Chat form of :meth:`render`: the prefix (and ``chunks``) as the system message, then ``user``;
        ``route=True``: a :class:`RoutedMessages`, with the endpoint as for :meth:`render`."""
        check_route_flag(route)
        messages = _with_chunks(render_messages(self._prefix(name), user, slots), chunks)
        return RoutedMessages(messages, **route_fields(self.route_prefix(name))) if route else messages

    def flush_uses(self) -> None:
        """Report the uses counted by ``render``/``messages`` since the last report."""
        for name, count in self._prefixes.take_reports():
            self.report_uses(name, count)

    def _prefix(self, name: str) -> Prefix:
        prefix = self._prefixes.fresh(name)
        if prefix is None:
            self.flush_uses()
            prefix = self._prefixes.keep(self.get_prefix(name))
        self._prefixes.pending_uses[name] += 1
        return prefix

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class AsyncClient(_Operations):
    """An asyncio client: every operation returns an awaitable. Close it with ``aclose`` or ``async with``."""

    _http_class = httpx.AsyncClient

    async def _call(self, call: _Call) -> Any:
        for attempt in itertools.count():
            try:
                outcome = await self._http.request(call.method, call.path, json=call.body)
            except (httpx.HTTPError, TypeError, ValueError) as exc:
                outcome = exc
            delay, value = self._settle(call, attempt, outcome)
            if delay is None:
                return value
            await asyncio.sleep(delay)

    @overload
    async def render(self, name: str, *, chunks: Iterable[Chunk] = (), volatile: str = "", route: Literal[False] = False,
                     **slots: Any) -> str: ...

    @overload
    async def render(self, name: str, *, chunks: Iterable[Chunk] = (), volatile: str = "", route: Literal[True],
                     **slots: Any) -> RoutedPrompt: ...

    async def render(self, name: str, *, chunks: Iterable[Chunk] = (), volatile: str = "", route: bool = False,
                     **slots: Any) -> str | RoutedPrompt:
        """As :meth:`Client.render`."""
        check_route_flag(route)
        prompt = assemble_prompt(render_text(await self._prefix(name), slots), chunks, volatile)
        return RoutedPrompt(prompt, **route_fields(await self.route_prefix(name))) if route else prompt  # type: ignore[misc]

    @overload
    async def messages(self, name: str, user: str, *, chunks: Iterable[Chunk] = (), route: Literal[False] = False,
                       **slots: Any) -> list[dict[str, str]]: ...

    @overload
    async def messages(self, name: str, user: str, *, chunks: Iterable[Chunk] = (), route: Literal[True],
                       **slots: Any) -> RoutedMessages: ...

    async def messages(self, name: str, user: str, *, chunks: Iterable[Chunk] = (), route: bool = False,
                       **slots: Any) -> list[dict[str, str]] | RoutedMessages:
        """As :meth:`Client.messages`."""
        check_route_flag(route)
        messages = _with_chunks(render_messages(await self._prefix(name), user, slots), chunks)
        return RoutedMessages(messages, **route_fields(await self.route_prefix(name))) if route else messages  # type: ignore[misc]

    async def flush_uses(self) -> None:
        """As :meth:`Client.flush_uses`."""
        for name, count in self._prefixes.take_reports():
            await self.report_uses(name, count)  # type: ignore[func-returns-value, misc]

    async def _prefix(self, name: str) -> Prefix:
        prefix = self._prefixes.fresh(name)
        if prefix is None:
            await self.flush_uses()
            prefix = self._prefixes.keep(await self.get_prefix(name))  # type: ignore[misc]
        self._prefixes.pending_uses[name] += 1
        return prefix

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()
