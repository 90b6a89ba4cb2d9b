"""Timed upkeep of the memtok store, each action logged:

- consolidation: near-duplicates merged (same word, keys within the merge distance;
  counts add for operator items only) and weak items packed to int8;
- resurfacing: items an operator marked come back to full influence when their time
  comes (their "last seen" moves to now);
- decay needs no timer: influence is computed from "last seen" at read time, and it
  never removes anything.

Runs through the model queue, so it never overlaps a request's use of the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.queue import ModelQueue

log = logging.getLogger(__name__)


class MemtokScheduler:
    def __init__(
        self,
        store: MemtokStore,
        queue: ModelQueue,
        consolidate_seconds: float,
        resurface_seconds: float,
        clock: Callable[[], int] = lambda: time.time_ns() // 1000,
    ) -> None:
        self._store = store
        self._queue = queue
        self._every = {"consolidate": consolidate_seconds, "resurface": resurface_seconds}
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []

    def consolidate_all(self) -> dict[str, int]:
        """One consolidation pass over every user (blocking); counts of what it did."""
        totals: dict[str, int] = {}
        for tenant, user in self._store.items.users():
            report = self._store.consolidate(tenant, user)
            for key, n in report.counts().items():
                totals[key] = totals.get(key, 0) + n
            if report.removed:
                log.info(
                    "memtok consolidation",
                    extra={"tenant": tenant, "user": user, "actions": report.audit_body()},
                )
        return totals

    def resurface_all(self) -> int:
        now, done = self._clock(), 0
        for tenant, user in self._store.items.users():
            due = self._store.resurface(tenant, user, now)
            for item in due:
                log.info(
                    "memtok resurfaced",
                    extra={"tenant": tenant, "user": user, "memtok_id": item.id},
                )
            done += len(due)
        return done

    async def _loop(self, name: str, action: Callable[[], object]) -> None:
        every = self._every[name]
        while True:
            await asyncio.sleep(every)
            try:
                result = await self._queue.call(action)
                log.info("memtok scheduled %s done", name, extra={"result": result})
            except asyncio.CancelledError:
                raise
            except Exception:  # logged, and the timer keeps running
                log.exception("memtok scheduled %s failed", name)

    def start(self) -> None:
        if self._every["consolidate"] > 0:
            self._tasks.append(asyncio.create_task(self._loop("consolidate", self.consolidate_all)))
        if self._every["resurface"] > 0:
            self._tasks.append(asyncio.create_task(self._loop("resurface", self.resurface_all)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
