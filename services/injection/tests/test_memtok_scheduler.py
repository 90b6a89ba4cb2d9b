"""The memtok store's timers: consolidation and resurfacing run on schedule, through the
model queue, and every action is logged; decay has no timer and removes nothing."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from memtok_fakes import DAY_US, close, obs, open_store

from hippo_injection.domain.memtok import policy as rules
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.scheduler import MemtokScheduler
from hippo_injection.domain.queue import ModelQueue

T0 = 1_760_000_000_000_000


async def test_timers_consolidate_and_resurface_and_log(
    tmp_path: Path, engine_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(tmp_path, Policy(min_rank=0.1, compress_below=0.0), url=engine_url)
    queue = ModelQueue(4)
    try:
        store.admit("t", "u", [obs("Lisbon", context="moved to")], T0)
        store.admit("t", "u", [obs("Lisbon", context="moved to sunny")], T0 + 1)
        old = store.admit("t", "u", [obs("Porto", context="visit")], T0).written[0].memtok_id
        assert store.mark_resurface("t", "u", old, T0 + 10 * DAY_US)
        store.policy = Policy(min_rank=0.1, merge_similarity=0.5, compress_below=0.0)
        now = T0 + 11 * DAY_US
        scheduler = MemtokScheduler(store, queue, 0.05, 0.05, clock=lambda: now)
        with caplog.at_level(logging.INFO, logger="hippo_injection.domain.memtok.scheduler"):
            scheduler.start()
            await asyncio.sleep(0.5)
            await scheduler.stop()
        words = sorted(m.word for m in store.items.by_user("t", "u"))
        assert words == ["Lisbon", "Porto"]  # the two Lisbons merged
        porto = store.items.get("t", "u", [old])[0]
        assert porto.last_seen_us == now and porto.resurface_at_us == 0
        assert rules.decay(porto, now, store.policy) == 1.0  # full influence again
        messages = [r.getMessage() for r in caplog.records]
        assert "memtok consolidation" in messages and "memtok resurfaced" in messages
        assert any(m.startswith("memtok scheduled consolidate done") for m in messages)
    finally:
        await queue.close()
        close(store)
