"""Micro-batching: concurrent requests share model calls; one model call at a time.

A single worker task owns the model. Requests queue their texts as jobs (large requests
split into jobs of at most `max_batch`) and await their futures. Each round the worker
takes queued jobs up to `max_batch` texts and runs one model call on a dedicated thread,
so the event loop keeps serving while the model computes. Requests that arrive during a
model call join the next one: batching grows with load without delaying a lone request
(`wait_s` can add a deliberate wait). A caller that gives up (deadline, cancel) cancels
its futures; jobs not yet started are dropped, so abandoned work stops at the next job.

Admission (backpressure): the worker measures its own rate (an EWMA of seconds per text
over full model calls), so a request knows how long the texts queued ahead of it will
take. When that wait is longer than what is left of the caller's deadline, or the queue
is at `max_queued` texts, it is refused at once with RESOURCE_EXHAUSTED and a RetryInfo
of about the time the queue needs to drain, instead of queueing work that would run into
its deadline (the caller would wait the whole deadline, then retry into a longer queue).
A request with nothing queued ahead of it is always admitted.

Each loaded model has its own batcher (queue, worker, thread, measured rate), so the
admission of a call counts only the texts queued for its model.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hippo_core import context as request_context
from hippo_core.errors import ResourceExhausted, Unavailable
from hippo_embedding import metrics
from hippo_embedding.domain.encoder import Vectors

EWMA_ALPHA = 0.2
# RetryInfo bounds: long enough to matter, short enough that a drained queue is refilled.
MIN_RETRY_AFTER_S = 0.05
MAX_RETRY_AFTER_S = 5.0


@dataclass
class _Job:
    texts: Sequence[str]
    future: asyncio.Future[Vectors]


class MicroBatcher:
    def __init__(
        self,
        encode: Callable[[Sequence[str]], Vectors],
        *,
        max_batch: int,
        max_queued: int,
        wait_s: float = 0.0,
        model: str = "",
    ) -> None:
        self._encode = encode
        self._model = model  # the `model` label of its metrics
        self._max_batch = max_batch
        self._max_queued = max_queued
        self._wait_s = wait_s
        self._queue: deque[_Job] = deque()
        self._queued_texts = 0
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoder")
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        # Seconds per text, measured (EWMA); None until the first model call.
        self._per_text: float | None = None
        self._queue_gauge = metrics.QUEUED.labels(model)
        self._queue_gauge.set(0)
        self._forward = metrics.FORWARD_SECONDS.labels(model)

    def expected_wait(self, extra: int = 0) -> float:
        """Seconds until `extra` more texts queued now would be done (0: not measured)."""
        if self._per_text is None:
            return 0.0
        return (self._queued_texts + extra) * self._per_text

    def _admit(self, count: int) -> None:
        retry_after = min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, self.expected_wait()))
        if self._queued_texts + count > self._max_queued:
            metrics.REJECTED.labels("queue_full").inc()
            raise ResourceExhausted(
                f"encoder queue full: {self._queued_texts} texts waiting "
                f"(max_queued_texts={self._max_queued}); retry with backoff",
                reason="QUEUE_FULL",
                retry_after=retry_after,
            )
        remaining = request_context.time_remaining()
        if remaining is None or self._queued_texts == 0:
            return
        wait = self.expected_wait(count)
        if wait > remaining:
            metrics.REJECTED.labels("deadline").inc()
            raise ResourceExhausted(
                f"encoder busy: {self._queued_texts} texts ahead need ~{wait:.2f}s, the "
                f"call has {max(0.0, remaining):.2f}s left; retry after the hint",
                reason="QUEUE_WAIT_EXCEEDS_DEADLINE",
                retry_after=retry_after,
            )

    def start(self) -> None:
        self._worker = asyncio.create_task(self._run(), name=f"micro-batcher {self._model}")

    async def close(self) -> None:
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for job in self._queue:
            job.future.cancel()
        self._queue.clear()
        self._executor.shutdown(wait=True)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts`, in order, computed in one or more shared model calls."""
        if self._closed or self._worker is None:
            raise Unavailable("the encoder is not running")
        self._admit(len(texts))
        loop = asyncio.get_running_loop()
        jobs = [
            _Job(texts[i : i + self._max_batch], loop.create_future())
            for i in range(0, len(texts), self._max_batch)
        ]
        self._queue.extend(jobs)
        self._queued(sum(len(job.texts) for job in jobs))
        self._wakeup.set()
        try:
            parts = [await job.future for job in jobs]
        except BaseException:
            for job in jobs:
                job.future.cancel()
            raise
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _measured(self, seconds: float, texts: int) -> None:
        # Calls of several texts only, once there is a figure: a queue is worked off in
        # full calls, and a lone short text (mostly fixed cost) would overstate its time.
        if self._per_text is not None and texts < min(8, self._max_batch):
            return
        sample = seconds / max(1, texts)
        old = self._per_text
        self._per_text = sample if old is None else old + EWMA_ALPHA * (sample - old)

    def _queued(self, delta: int) -> None:
        self._queued_texts += delta
        self._queue_gauge.set(self._queued_texts)

    def _take(self) -> list[_Job]:
        batch: list[_Job] = []
        size = 0
        while self._queue and size + len(self._queue[0].texts) <= self._max_batch:
            job = self._queue.popleft()
            self._queued(-len(job.texts))
            if job.future.done():  # the caller gave up before its turn
                metrics.DROPPED.inc(len(job.texts))
                continue
            batch.append(job)
            size += len(job.texts)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                if self._wait_s > 0 and self._queued_texts < self._max_batch:
                    await asyncio.sleep(self._wait_s)
                batch = self._take()
                if not batch:
                    continue
                texts = [text for job in batch for text in job.texts]
                metrics.BATCH_TEXTS.observe(len(texts))
                metrics.BATCH_REQUESTS.observe(len(batch))
                started = time.perf_counter()
                try:
                    vectors = await loop.run_in_executor(self._executor, self._encode, texts)
                except Exception as exc:  # the model failed: every caller of this batch hears it
                    for job in batch:
                        if not job.future.done():
                            job.future.set_exception(exc)
                    continue
                finally:
                    took = time.perf_counter() - started
                    self._forward.observe(took)
                self._measured(took, len(texts))
                metrics.TEXTS.labels("model").inc(len(texts))
                offset = 0
                for job in batch:
                    rows = vectors[offset : offset + len(job.texts)]
                    offset += len(job.texts)
                    if not job.future.done():
                        job.future.set_result(rows)
