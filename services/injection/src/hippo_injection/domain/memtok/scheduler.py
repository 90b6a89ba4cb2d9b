"""Timed upkeep of the memtok store, each action logged:

- consolidation: near-duplicates merged (same word, keys within the merge distance;
  counts add for operator items only) and weak items packed to int8;
- resurfacing: items an operator marked come back to full influence when their time
  comes (their "last seen" moves to now);
- decay needs no timer: influence is computed from "last seen" at read time, and it
  never removes anything;
- cluster mode: the change feed's records of deleted items are trimmed after a retention
  (with consolidation), and an idle replica's key index catches up with the others'
  writes (`sync_seconds`), so a trimmed feed never forces a rebuild on a request's path.

Consolidation, resurfacing and trimming run in one replica at a time (the store's
upkeep lease; always, with one process). Everything runs through the model queue, so it
never overlaps a request's use of the store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from hippo_core.errors import ResourceExhausted
from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.queue import ModelQueue, Priority
from hippo_injection.domain.queue import priority as queue_priority

log = logging.getLogger(__name__)


class MemtokScheduler:
    def __init__(
        self,
        store: MemtokStore,
        queue: ModelQueue,
        consolidate_seconds: float,
        resurface_seconds: float,
        clock: Callable[[], int] = lambda: time.time_ns() // 1000,
        *,
        sync_seconds: float = 0.0,
        feed_retention_seconds: float = 7 * 86_400.0,
    ) -> None:
        self._store = store
        self._queue = queue
        self._every = {
            "consolidate": consolidate_seconds,
            "resurface": resurface_seconds,
            "sync": sync_seconds if store.items.shared else 0.0,
        }
        self._retention_us = int(feed_retention_seconds * 1_000_000)
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []

    def consolidate_all(self) -> dict[str, int]:
        """One consolidation pass over every user (blocking); counts of what it did.
        Nothing when another replica holds the upkeep lease."""
        totals: dict[str, int] = {}
        if not self._store.items.owns_upkeep():
            return totals
        for tenant, user in self._store.items.users():
            report = self._store.consolidate(tenant, user)
            for key, n in report.counts().items():
                totals[key] = totals.get(key, 0) + n
            if report.removed:
                log.info(
                    "memtok consolidation",
                    extra={"tenant": tenant, "user": user, "actions": report.audit_body()},
                )
        trimmed = self._store.trim_feed(self._clock(), self._retention_us)
        if trimmed:
            totals["feed_trimmed"] = trimmed
        return totals

    def resurface_all(self) -> int:
        now, done = self._clock(), 0
        if not self._store.items.owns_upkeep():
            return done
        for tenant, user in self._store.items.users():
            due = self._store.resurface(tenant, user, now)
            for item in due:
                log.info(
                    "memtok resurfaced",
                    extra={"tenant": tenant, "user": user, "memtok_id": item.id},
                )
            done += len(due)
        return done

    async def _loop(self, name: str, action: Callable[[], object], quiet: bool = False) -> None:
        every = self._every[name]
        # Upkeep is background work: nobody waits for it, so it yields the model to any
        # interactive request (this task's own context: the edges never set it here).
        queue_priority.set(Priority.BACKGROUND)
        while True:
            await asyncio.sleep(every)
            try:
                result = await self._queue.call(action)
                log.log(
                    logging.DEBUG if quiet else logging.INFO,
                    "memtok scheduled %s done",
                    name,
                    extra={"result": result},
                )
            except asyncio.CancelledError:
                raise
            except ResourceExhausted:
                # A full model queue: requests are running, and each catches up itself.
                log.log(logging.DEBUG if quiet else logging.WARNING, "memtok %s skipped", name)
            except Exception:  # logged, and the timer keeps running
                log.exception("memtok scheduled %s failed", name)

    def start(self) -> None:
        if self._every["consolidate"] > 0:
            self._tasks.append(asyncio.create_task(self._loop("consolidate", self.consolidate_all)))
        if self._every["resurface"] > 0:
            self._tasks.append(asyncio.create_task(self._loop("resurface", self.resurface_all)))
        if self._every["sync"] > 0:
            # Every minute or so: logged at debug only.
            self._tasks.append(asyncio.create_task(self._loop("sync", self._store.sync, True)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
