"""Worker threads for blocking calls (Redis, Milvus, the model), bounded for real.

A request answered 504 at its deadline abandons its thread (anyio's ``abandon_on_cancel``): the thread runs
on. anyio gives the thread's limiter token back at the cancel, not when the thread ends, so a flood of
requests that time out started a new thread for each (150 requests answered 504 in 0.9 s left 121 threads
and about 111 s of model work nobody waited for). Here a slot is held from the moment a call is handed to a
thread until that thread has finished, so at most ``max_threads`` run, abandoned or not; a request waiting
for a slot waits on the event loop, costs no thread, and is answered 504 at its deadline like any other.

An abandoned call is also told its caller has gone (``ragcache.core.batching.CALLER_GONE``): texts it queued for
the model that no other caller waits for are taken out of the queue rather than computed for nobody.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import anyio
from anyio import to_thread

from ragcache.core import CALLER_GONE

__all__ = ["WorkerPool", "current_pool", "DEFAULT_MAX_THREADS"]

T = TypeVar("T")
DEFAULT_MAX_THREADS = 32


class WorkerPool:
    """At most ``max_threads`` blocking calls running at once, counting abandoned ones until they end."""

    def __init__(self, max_threads: int = DEFAULT_MAX_THREADS):
        self.max_threads = max_threads
        self.num_running = 0  # calls in a thread now, abandoned ones included
        self.num_calls = 0  # calls handed to a thread since the start (the tests: an L1 hit is answered without one)
        self._slots: anyio.CapacityLimiter | None = None  # made in the event loop, on first use
        self._threads: anyio.CapacityLimiter | None = None

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in a worker thread once a slot is free; abandoned (not awaited) when cancelled."""
        if self._slots is None or self._threads is None:
            self._slots = anyio.CapacityLimiter(self.max_threads)
            # anyio's own limiter for the thread hand-off; never the binding one, since a slot is taken first.
            self._threads = anyio.CapacityLimiter(self.max_threads)
        slot = object()
        await self._slots.acquire_on_behalf_of(slot)  # cancelled while waiting here: nothing was started
        loop = asyncio.get_running_loop()
        call = _Call(function, args, release=lambda: self._release(slot),
                     release_from_thread=lambda: self._release_from_thread(loop, slot))
        self.num_running += 1
        self.num_calls += 1
        try:
            result = await to_thread.run_sync(call.run, abandon_on_cancel=True, limiter=self._threads)
        except BaseException:
            call.abandon()  # the caller is gone (cancelled at its deadline) or the call failed: either way, done waiting
            raise
        self._release(slot)  # the call has ended and its caller is here, on the loop: no second wake-up of the loop
        return result

    def _release(self, slot: object) -> None:
        """On the event loop, once per call: when its caller got the outcome, or it never started, or (from
        ``_release_from_thread``) an abandoned call's thread ended."""
        self.num_running -= 1
        assert self._slots is not None
        self._slots.release_on_behalf_of(slot)

    def _release_from_thread(self, loop: asyncio.AbstractEventLoop, slot: object) -> None:
        try:
            loop.call_soon_threadsafe(self._release, slot)
        except RuntimeError:  # the loop has closed (shutdown): nothing waits for the slot any more
            pass


class _Call:
    """One call handed to a thread: runs at most once, its slot released exactly once, and knows whether its
    caller has gone.

    Who releases the slot: the caller, on the event loop, when it has the outcome (the common case: no extra
    wake-up of the loop) or when it leaves before the call started or after it ended; the thread, through
    ``release_from_thread``, only when the caller left while the call ran. The lock orders the thread's end
    against the caller's leaving, so exactly one of them does it."""

    def __init__(self, function: Callable, args: tuple, *, release: Callable[[], None], release_from_thread: Callable[[], None]):
        self._function, self._args = function, args
        self._release, self._release_from_thread = release, release_from_thread
        self._gone = threading.Event()
        self._lock = threading.Lock()
        self._started = self._finished = False

    def run(self):
        with self._lock:
            if self._gone.is_set():
                return None  # abandoned before a thread took it: its slot was released then
            self._started = True
        CALLER_GONE.set(self._gone)
        try:
            return self._function(*self._args)
        finally:
            with self._lock:
                self._finished = True
                abandoned = self._gone.is_set()
            if abandoned:
                self._release_from_thread()

    def abandon(self) -> None:
        """The caller stops waiting (cancelled, or the call raised): the slot is released now unless the call runs on."""
        with self._lock:
            self._gone.set()
            running = self._started and not self._finished
        if not running:
            self._release()


# The pool of the app serving the current request (set by LimitsMiddleware); a default one elsewhere.
_DEFAULT_POOL = WorkerPool()
current_pool: ContextVar[WorkerPool] = ContextVar("ragcache_worker_pool", default=_DEFAULT_POOL)
