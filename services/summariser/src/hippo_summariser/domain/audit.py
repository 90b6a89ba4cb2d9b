"""Recording merges in the audit log: a transactional outbox and its drainer.

Every committed merge becomes one "merge" entry (session, merged memory ids, facts
checked/kept before and after validation, retention, LLM calls, repair, summary tokens,
seconds), written by this code, never by a model. The entry holds ids and figures, never
summary or turn text (the audit log's public body outlives a user's erasure).

Delivery is at-least-once into an idempotent log, in order:
- the event is queued in the session store's outbox by the merge's own transaction
  (`SessionStore.commit_merge(event=...)`), so a merge is never committed unrecorded and a
  crash at any point loses no event;
- one drainer per process delivers the outbox oldest first, in batches, each event under
  its `event_id` as idempotency key (a delivery whose reply was lost, or two processes
  sharing one store delivering the same event, append it once);
- while the audit service is down or busy the outbox grows and the drainer backs off
  (capped, jittered); merges go on. An event the service refuses for good
  (INVALID_ARGUMENT: a bug) is set aside in the outbox with the reason, logged and counted,
  never silently dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from hippo_core import backoff
from hippo_core.errors import HippoError, InvalidArgument
from hippo_summariser import metrics
from hippo_summariser.domain.models import MergeEvent
from hippo_summariser.domain.ports import SessionStore

log = structlog.stdlib.get_logger("hippo.summariser.audit")

ACTOR = "summariser"
EVENT_TYPE = "merge"
MAX_IDS = 1000  # the audit service's limit on memory ids per entry


class AuditSink(Protocol):
    """The audit service, as the summariser uses it."""

    async def append(self, events: Sequence[MergeEvent]) -> None:
        """Append all, in order, or raise (HippoError). Idempotent per event_id."""
        ...


def body(event: MergeEvent) -> dict[str, object]:
    """The entry's public body: figures only (see the module docstring)."""
    return {
        "version": event.version,
        "turns_merged": len(event.merged_memory_ids),
        "ids_listed": min(len(event.merged_memory_ids), MAX_IDS),
        "summary_tokens": event.summary_tokens,
        "facts": event.facts,
        "kept_llm": event.kept_llm,
        "kept": event.kept,
        "retention_llm": round(event.retention_llm, 4),
        "retention": round(event.retention, 4),
        "llm_calls": event.llm_calls,
        "repaired": event.repaired,
        "seconds": round(event.seconds, 3),
        "merged_at_us": event.time_us,
    }


@dataclass(frozen=True)
class OutboxConfig:
    batch: int = 100
    retry_min_seconds: float = 0.5
    retry_max_seconds: float = 30.0
    # Another process sharing the store may queue events this one is not told about.
    poll_seconds: float = 5.0


class AuditOutbox:
    """Delivers the store's outbox to the audit log. Create inside the running loop;
    `start()` once, `notify()` after each commit that queued an event, `close()` at stop
    (undelivered events stay queued for the next start)."""

    def __init__(
        self,
        store: SessionStore,
        sink: AuditSink,
        config: OutboxConfig | None = None,
        *,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),
    ) -> None:
        self._store, self._sink = store, sink
        self._config = config or OutboxConfig()
        self._jitter = jitter
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            # A fresh context: no inbound call's deadline may leak into deliveries.
            self._task = asyncio.create_task(
                self._run(), name="audit-outbox", context=contextvars.Context()
            )

    def notify(self) -> None:
        self._idle.clear()
        self._wake.set()

    async def drained(self, timeout: float) -> bool:
        """Wait until the outbox is empty (True) or `timeout` passes (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        failures = 0
        while True:
            self._wake.clear()
            try:
                delivered = await self._deliver_batch()
            except asyncio.CancelledError:
                raise
            except HippoError as exc:
                failures += 1
                metrics.AUDIT_FAILURES.labels(type(exc).__name__).inc()
                await self._backoff(failures, exc)
                continue
            except Exception as exc:  # a bug: log it, back off, keep the events queued
                failures += 1
                log.exception("audit_outbox_failed", error=repr(exc))
                await self._backoff(failures, exc)
                continue
            failures = 0
            if delivered:
                continue
            if not self._wake.is_set():  # nothing was committed since the empty peek
                self._idle.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._config.poll_seconds)

    async def _deliver_batch(self) -> int:
        rows = await asyncio.to_thread(self._store.outbox_peek, self._config.batch)
        await self._report()
        if not rows:
            return 0
        try:
            await self._sink.append([event for _, event in rows])
        except InvalidArgument:
            if len(rows) == 1:
                raise
            await self._one_by_one(rows)  # find the refused one; deliver the rest
            return len(rows)
        await asyncio.to_thread(self._store.outbox_remove, [i for i, _ in rows])
        metrics.AUDIT_DELIVERED.inc(len(rows))
        await self._report()
        return len(rows)

    async def _one_by_one(self, rows: Sequence[tuple[int, MergeEvent]]) -> None:
        for outbox_id, event in rows:
            try:
                await self._sink.append([event])
            except InvalidArgument as exc:
                log.error("audit_event_refused", event_id=event.event_id, reason=str(exc))
                await asyncio.to_thread(self._store.outbox_bury, outbox_id, str(exc))
                continue
            await asyncio.to_thread(self._store.outbox_remove, [outbox_id])
            metrics.AUDIT_DELIVERED.inc()

    async def _backoff(self, failures: int, exc: BaseException) -> None:
        cfg = self._config
        wait = backoff.delay(failures, cfg.retry_min_seconds, cfg.retry_max_seconds, self._jitter())
        log.warning("audit_retry_later", error=str(exc) or repr(exc), seconds=round(wait, 2))
        await asyncio.sleep(wait)

    async def _report(self) -> None:
        live, dead = await asyncio.to_thread(self._store.outbox_depth)
        metrics.AUDIT_OUTBOX.set(live)
        metrics.AUDIT_DEAD.set(dead)
