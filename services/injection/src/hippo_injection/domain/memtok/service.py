"""The memtok use cases the service serves: plan influence for a query, write a turn's
words, record a user's influence mode, erase a user. Plans, writes and erasures run on
the model queue's thread (the pipeline's passes and the store's writes are blocking and
use the shared model and key index); a mode is one row, read and written on a worker
thread so the event loop never waits on the database."""

from __future__ import annotations

import asyncio
import time

from hippo_core.errors import InvalidArgument
from hippo_injection.domain.memtok.models import WriteReport
from hippo_injection.domain.memtok.pipeline import InfluencePipeline, Mode, Plan
from hippo_injection.domain.queue import ModelQueue

MAX_QUERY_CHARS = 8192


def _now(time_us: int) -> int:
    return time_us if time_us > 0 else time.time_ns() // 1000


def _scope(tenant: str, user: str) -> None:
    if not tenant:
        raise InvalidArgument("tenant", "required")
    if not user:
        raise InvalidArgument("user_id", "required")


def _text(field: str, text: str, required: bool = True) -> None:
    if required and not text.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidArgument(field, f"at most {MAX_QUERY_CHARS} characters, got {len(text)}")


class MemtokService:
    def __init__(self, pipeline: InfluencePipeline, queue: ModelQueue) -> None:
        self.pipeline = pipeline
        self._queue = queue

    async def resolve(self, tenant: str, user: str, mode: Mode | None) -> Mode:
        """The request's mode, else the user's recorded one, else off."""
        if mode is not None:
            return mode
        recorded = await asyncio.to_thread(self.pipeline.store.items.user_mode, tenant, user)
        return Mode(recorded) if recorded else Mode.OFF

    async def plan(
        self, tenant: str, user: str, query: str, mode: Mode | None, time_us: int
    ) -> Plan:
        _scope(tenant, user)
        _text("query", query)
        chosen = await self.resolve(tenant, user, mode)
        return await self._queue.call(
            self.pipeline.plan, tenant, user, query, _now(time_us), chosen
        )

    async def write(
        self, tenant: str, user: str, query: str, reply: str, time_us: int
    ) -> WriteReport:
        _scope(tenant, user)
        _text("query", query)
        _text("reply", reply, required=False)
        return await self._queue.call(
            self.pipeline.write, tenant, user, query, reply, _now(time_us)
        )

    async def set_user_mode(self, tenant: str, user: str, mode: Mode | None) -> Mode:
        _scope(tenant, user)
        value = None if mode is None else mode.value
        await asyncio.to_thread(self.pipeline.store.items.set_user_mode, tenant, user, value)
        return mode or Mode.OFF

    async def forget(self, tenant: str, user: str) -> int:
        """Erase the user from the memtok store (every replica's key index follows);
        the items erased. Idempotent: a retry erases nothing more and answers 0."""
        _scope(tenant, user)
        return await self._queue.call(self.pipeline.store.forget, tenant, user)

    def close(self) -> None:
        self.pipeline.store.keys.close()
        self.pipeline.store.items.close()
