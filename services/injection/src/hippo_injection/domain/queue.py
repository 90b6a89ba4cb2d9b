"""The model queue: one request holds the model at a time, interactive requests before
background ones, a bounded wait list per class, then RESOURCE_EXHAUSTED.

A request takes a lease and runs its forward passes through it on the queue's one worker
thread, so the event loop keeps serving while the model computes and no two forward
passes ever overlap. A lease spans a whole request, not one pass, because influence hooks
change the shared model: a second request's pass must never run while the first one's
hooks are installed.

Priorities: when the model frees, the oldest interactive waiter gets it; background
waiters (the summariser's merges) only run when no interactive one waits. The lease is
handed straight to the next waiter, so a request arriving in between cannot barge in.
Background work cannot be interrupted once it holds the model (see above): an
interactive request waits at most for the lease in progress. Each class has its own wait
bound, so a full background list never refuses an interactive request.

A caller that gives up while a pass runs cannot stop that pass mid-way (torch has no
interrupt), but its clean-up is queued behind it on the same thread, so the next request
always starts on a model without hooks.

The class of a request comes from the `priority` context variable, set by the edges (HTTP
header, gRPC metadata) for the request's task; the domain's own calls need not pass it.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TypeVar

from hippo_core.errors import ResourceExhausted, Unavailable
from hippo_injection import metrics

T = TypeVar("T")

# RetryInfo bounds: a hint under 0.1 s only makes clients spin; over a minute it says
# "go elsewhere", which a single-host deployment cannot.
MIN_RETRY_AFTER_S = 0.1
MAX_RETRY_AFTER_S = 60.0
# Until a lease has been measured: about one short generation on the CPU model.
DEFAULT_LEASE_S = 1.0
EWMA_ALPHA = 0.2


class Priority(enum.Enum):
    INTERACTIVE = "interactive"  # someone waits for the reply (Chat, the operator's CLI)
    BACKGROUND = "background"  # nobody waits: merges, upkeep


ORDER = (Priority.INTERACTIVE, Priority.BACKGROUND)
priority: contextvars.ContextVar[Priority] = contextvars.ContextVar(
    "priority", default=Priority.INTERACTIVE
)


def parse_priority(value: str | None) -> Priority:
    """A caller's stated class: only "background" lowers it; anything else (missing,
    misspelt, "interactive") is interactive. A caller can only give its own requests
    away, never take another's place, so the value needs no authorisation (under TLS
    only the services allowed to generate reach the model at all)."""
    if value is not None and value.strip().lower() == Priority.BACKGROUND.value:
        return Priority.BACKGROUND
    return Priority.INTERACTIVE


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
    def __init__(self, max_waiting: int, max_waiting_background: int | None = None) -> None:
        background = max_waiting if max_waiting_background is None else max_waiting_background
        self._bounds = {Priority.INTERACTIVE: max_waiting, Priority.BACKGROUND: background}
        self._waiters: dict[Priority, deque[asyncio.Future[None]]] = {p: deque() for p in ORDER}
        self._busy = False
        self._lease_seconds: float | None = None  # EWMA of measured leases
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self._closed = False

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiters.values())

    def waiting_in(self, cls: Priority) -> int:
        return len(self._waiters[cls])

    def retry_after(self, cls: Priority) -> float:
        """Seconds until a request of `cls` queued now would likely get the model: the
        mean lease times its position (the one running, the waiters that go first)."""
        ahead = 1 + len(self._waiters[Priority.INTERACTIVE])
        if cls is Priority.BACKGROUND:
            ahead += len(self._waiters[Priority.BACKGROUND])
        mean = self._lease_seconds if self._lease_seconds is not None else DEFAULT_LEASE_S
        return min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, mean * ahead))

    async def call(self, fn: Callable[..., T], *args: object) -> T:
        """One blocking model call under a short lease (CountTokens-sized work)."""
        async with self.lease() as lease:
            return await lease.call(fn, *args)

    @asynccontextmanager
    async def lease(self, cls: Priority | None = None) -> AsyncIterator[Lease]:
        """Hold the model for a request of class `cls` (default: the context's)."""
        cls = priority.get() if cls is None else cls
        if self._closed:
            raise Unavailable("the model is shutting down; retry on another replica")
        await self._acquire(cls)
        started = time.perf_counter()
        try:
            yield Lease(self._executor)
        finally:
            self._measure(time.perf_counter() - started)
            self._release()

    async def _acquire(self, cls: Priority) -> None:
        if not self._busy:
            self._busy = True  # nobody waits when the model is free: _release hands over
            return
        bound = self._bounds[cls]
        if len(self._waiters[cls]) >= bound:
            metrics.REJECTED.labels(cls.value).inc()
            setting = "max_waiting" if cls is Priority.INTERACTIVE else "max_waiting_background"
            raise ResourceExhausted(
                f"model queue full: {len(self._waiters[cls])} {cls.value} requests waiting "
                f"({setting}={bound}); retry with backoff",
                reason="QUEUE_FULL",
                retry_after=self.retry_after(cls),
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiters[cls]
        queue.append(future)
        self._depth(cls)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # handed the model just as we gave up: pass it on
            elif future in queue:
                queue.remove(future)
                self._depth(cls)
            raise

    def _release(self) -> None:
        """Hand the model to the oldest waiter of the first class that has one."""
        for cls in ORDER:
            queue = self._waiters[cls]
            while queue:
                future = queue.popleft()
                self._depth(cls)
                if not future.done():  # a cancelled waiter leaves once its task resumes
                    future.set_result(None)  # _busy stays True: the model is theirs now
                    return
        self._busy = False

    def _depth(self, cls: Priority) -> None:
        metrics.QUEUE_DEPTH.labels(cls.value).set(len(self._waiters[cls]))

    def _measure(self, seconds: float) -> None:
        previous = self._lease_seconds
        self._lease_seconds = (
            seconds if previous is None else previous + EWMA_ALPHA * (seconds - previous)
        )

    async def close(self) -> None:
        """Refuse new leases; let the worker thread finish what it has."""
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, True)
