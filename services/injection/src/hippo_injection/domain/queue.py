"""The model queue: one request holds the model at a time, a bounded wait list, then
RESOURCE_EXHAUSTED.

A request takes a lease (FIFO: asyncio.Lock wakes waiters in arrival order) and runs its
forward passes through it on the queue's one worker thread, so the event loop keeps
serving while the model computes and no two forward passes ever overlap. A lease spans a
whole request, not one pass, because influence hooks change the shared model: a second
request's pass must never run while the first one's hooks are installed.

A caller that gives up while a pass runs cannot stop that pass mid-way (torch has no
interrupt), but its clean-up is queued behind it on the same thread, so the next request
always starts on a model without hooks.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TypeVar

from hippo_core.errors import ResourceExhausted, Unavailable
from hippo_injection import metrics

T = TypeVar("T")


class Lease:
    """The right to run forward passes; valid inside `ModelQueue.lease()` only."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self._executor = executor

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` on the model thread and wait for it."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        # The caller's context goes along (run_in_executor does not copy it): the model
        # thread's logs keep the request id, and its peer calls (memtok keys from the
        # embedding service) stay in the request's trace.
        context = contextvars.copy_context()
        try:
            return await loop.run_in_executor(self._executor, context.run, fn, *args)
        finally:
            metrics.MODEL_BUSY_SECONDS.inc(time.perf_counter() - started)

    async def cleanup(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the model thread even if the caller is being cancelled: it is
        queued behind any pass still running and completes before the lease is reused."""
        loop = asyncio.get_running_loop()
        await asyncio.shield(loop.run_in_executor(self._executor, fn))


class ModelQueue:
    def __init__(self, max_waiting: int) -> None:
        self._max_waiting = max_waiting
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self._closed = False

    @property
    def waiting(self) -> int:
        return self._waiting

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """One blocking model call under a short lease (CountTokens-sized work)."""
        async with self.lease() as lease:
            return await lease.call(fn, *args)

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[Lease]:
        if self._closed:
            raise Unavailable("the model is shutting down; retry on another replica")
        if self._lock.locked() and self._waiting >= self._max_waiting:
            metrics.REJECTED.inc()
            raise ResourceExhausted(
                f"model queue full: {self._waiting} requests waiting "
                f"(max_waiting={self._max_waiting}); retry with backoff",
                reason="QUEUE_FULL",
            )
        self._waiting += 1
        metrics.QUEUE_DEPTH.set(self._waiting)
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
            metrics.QUEUE_DEPTH.set(self._waiting)
        try:
            yield Lease(self._executor)
        finally:
            self._lock.release()

    async def close(self) -> None:
        """Refuse new leases; let the worker thread finish what it has."""
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, True)
