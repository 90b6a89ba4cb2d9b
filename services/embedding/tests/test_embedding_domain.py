"""Domain unit tests: validation, cache, micro-batching. The encoder is a test double
of the Encoder port; the real adapters are tested in test_embedding_encoders.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from hippo_core import context as request_context
from hippo_core.errors import InvalidArgument, ResourceExhausted
from hippo_embedding.domain.batcher import MicroBatcher
from hippo_embedding.domain.cache import VectorCache, key
from hippo_embedding.domain.service import EmbeddingService, Model
from hippo_embedding.domain.validation import Limits, validate

LIMITS = Limits(max_texts=4, max_chars=10)


class CountingEncoder:
    """Deterministic vectors from the text; records every model call."""

    backend, max_tokens = "test", 256

    def __init__(self, delay: float = 0.0, model: str = "double", dimension: int = 8) -> None:
        self.model, self.dimension = model, dimension
        self.calls: list[list[str]] = []
        self.delay = delay
        self.started = threading.Event()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.started.set()
        self.calls.append(list(texts))
        time.sleep(self.delay)
        width = self.dimension - 1
        rows = np.array(
            [[len(t), *(ord(c) for c in t.ljust(width)[:width])] for t in texts], np.float32
        )
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("texts", "field", "fragment"),
    [
        ([], "texts", "at least 1"),
        (["a"] * 5, "texts", "at most 4 texts per call, got 5"),
        (["ok", "x" * 11], "texts[1]", "at most 10 characters, got 11"),
        (["ok", "a\ud800"], "texts[1]", "lone surrogate at character 1"),
    ],
)
def test_validation_names_field_and_limit(texts: list[str], field: str, fragment: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validate(texts, LIMITS)
    assert caught.value.field == field
    assert fragment in caught.value.message


def test_validation_accepts_limits_exactly() -> None:
    validate(["x" * 10] * 4, LIMITS)
    validate([""], LIMITS)


def test_cache_evicts_least_recently_used() -> None:
    cache = VectorCache(2)
    a, b, c = key("m", "a"), key("m", "b"), key("m", "c")
    cache.put(a, np.ones(2, np.float32))
    cache.put(b, np.ones(2, np.float32))
    assert cache.get(a) is not None  # a is now the most recent
    cache.put(c, np.ones(2, np.float32))
    assert cache.get(b) is None and cache.get(a) is not None and len(cache) == 2


def test_cached_rows_cannot_be_mutated_by_callers() -> None:
    cache = VectorCache(4)
    row = np.ones(3, np.float32)
    cache.put(key("m", "a"), row)
    row[0] = 9
    stored = cache.get(key("m", "a"))
    assert stored is not None and stored[0] == 1 and not stored.flags.writeable


async def test_concurrent_requests_share_model_calls_in_order() -> None:
    encoder = CountingEncoder(delay=0.05)
    batcher = MicroBatcher(encoder.encode, max_batch=64, max_queued=1000)
    batcher.start()
    try:
        texts = [f"text number {i}" for i in range(20)]
        results = await asyncio.gather(*(batcher.embed([t]) for t in texts))
    finally:
        await batcher.close()
    assert len(encoder.calls) < len(texts)  # shared calls, not one per request
    assert sum(len(c) for c in encoder.calls) == len(texts)
    expected = encoder.encode(texts)
    np.testing.assert_allclose(np.concatenate(results), expected)


async def test_large_request_is_split_into_max_batch_calls() -> None:
    encoder = CountingEncoder()
    batcher = MicroBatcher(encoder.encode, max_batch=4, max_queued=1000)
    batcher.start()
    try:
        out = await batcher.embed([f"t{i}" for i in range(10)])
    finally:
        await batcher.close()
    assert [len(c) for c in encoder.calls] == [4, 4, 2]
    np.testing.assert_allclose(out, encoder.encode([f"t{i}" for i in range(10)]))


async def test_cancelled_caller_work_is_dropped_before_it_runs() -> None:
    encoder = CountingEncoder(delay=0.2)
    batcher = MicroBatcher(encoder.encode, max_batch=2, max_queued=1000)
    batcher.start()
    try:
        task = asyncio.ensure_future(batcher.embed([f"t{i}" for i in range(10)]))
        await asyncio.to_thread(encoder.started.wait, 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)  # the chunk already on the model finishes; no more start
    finally:
        await batcher.close()
    assert sum(len(c) for c in encoder.calls) <= 4


async def test_full_queue_is_refused_not_buffered() -> None:
    encoder = CountingEncoder(delay=0.2)
    batcher = MicroBatcher(encoder.encode, max_batch=2, max_queued=4)
    batcher.start()
    try:
        first = asyncio.ensure_future(batcher.embed(["a", "b", "c", "d"]))
        await asyncio.sleep(0)
        with pytest.raises(ResourceExhausted, match="max_queued_texts=4"):
            await batcher.embed(["e"])
        await first
    finally:
        await batcher.close()


async def test_a_call_whose_deadline_the_queue_would_outlast_is_refused_at_once() -> None:
    """With its rate measured (~25 ms a text here), a queue of 40 texts needs ~1 s: a
    call with 0.3 s left is refused at once with a RetryInfo of about the queue's drain
    time, one with 5 s left is admitted, and a call with nothing queued ahead always is."""
    encoder = CountingEncoder(delay=0.2)  # 0.2 s per call of 8 texts
    batcher = MicroBatcher(encoder.encode, max_batch=8, max_queued=1000)
    batcher.start()

    async def with_deadline(seconds: float, texts: list[str]) -> np.ndarray:
        request_context.deadline.set(time.monotonic() + seconds)
        return await batcher.embed(texts)

    try:
        await batcher.embed([f"w{i}" for i in range(8)])  # measures: 25 ms a text
        assert batcher.expected_wait(8) == pytest.approx(0.2, rel=0.3)
        await asyncio.wait_for(with_deadline(0.01, ["lone"]), 5)  # nothing ahead: admitted
        backlog = asyncio.ensure_future(batcher.embed([f"q{i}" for i in range(40)]))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(ResourceExhausted) as refused:
            await asyncio.create_task(with_deadline(0.3, ["late"]))
        assert time.monotonic() - started < 0.1  # refused now, not at the deadline
        assert refused.value.reason == "QUEUE_WAIT_EXCEEDS_DEADLINE"
        assert 0.4 < (refused.value.retry_after or 0) <= 5.0
        admitted = await asyncio.create_task(with_deadline(5.0, ["patient"]))
        assert admitted.shape == (1, 8)
        await backlog
    finally:
        await batcher.close()


async def test_model_failure_reaches_every_caller_of_the_batch() -> None:
    def broken(texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("model exploded")

    batcher = MicroBatcher(broken, max_batch=8, max_queued=100)
    batcher.start()
    try:
        results = await asyncio.gather(
            batcher.embed(["a"]), batcher.embed(["b"]), return_exceptions=True
        )
    finally:
        await batcher.close()
    assert all(isinstance(r, RuntimeError) for r in results)


async def test_service_encodes_each_distinct_text_once_and_uses_cache() -> None:
    encoder = CountingEncoder()
    batcher = MicroBatcher(encoder.encode, max_batch=64, max_queued=100)
    batcher.start()
    service = EmbeddingService([Model(encoder, batcher)], VectorCache(100), Limits(100, 100))
    try:
        first = await service.embed(["a", "b", "a"])
        second = await service.embed(["b", "c"])
    finally:
        await batcher.close()
    assert encoder.calls == [["a", "b"], ["c"]]
    assert first.cached == 0 and second.cached == 1
    np.testing.assert_allclose(first.vectors[0], first.vectors[2])
    np.testing.assert_allclose(second.vectors[0], first.vectors[1])


def test_cache_keys_hold_the_model_apart() -> None:
    """The same text under two models is two keys, and a name cannot spill into the text."""
    assert key("a", "text") != key("b", "text")
    assert key("ab", "c") != key("a", "bc")


async def test_each_model_has_its_own_batcher_cache_entries_and_dimension() -> None:
    """Two models at once: a name picks its model (its dimension, its calls), "" is the
    default (the first), the cache does not answer one model's text with the other's
    vector, and an unknown name is INVALID_ARGUMENT on field `model` listing the names."""
    small, wide = (
        CountingEncoder(model="small", dimension=8),
        CountingEncoder(model="wide", dimension=16),
    )
    models = [
        Model(enc, MicroBatcher(enc.encode, max_batch=64, max_queued=100, model=enc.model))
        for enc in (small, wide)
    ]
    for model in models:
        model.batcher.start()
    service = EmbeddingService(models, VectorCache(100), Limits(100, 100))
    try:
        default = await service.embed(["same text"])
        by_name = await service.embed(["same text"], "wide")
        again = await service.embed(["same text"], "small")
        with pytest.raises(InvalidArgument) as caught:
            await service.embed(["same text"], "absent")
    finally:
        for model in models:
            await model.batcher.close()
    assert (default.model, default.vectors.shape, default.cached) == ("small", (1, 8), 0)
    assert (by_name.model, by_name.vectors.shape, by_name.cached) == ("wide", (1, 16), 0)
    assert again.cached == 1 and small.calls == [["same text"]] and wide.calls == [["same text"]]
    assert caught.value.field == "model"
    assert "'absent'" in caught.value.message and "'small', 'wide'" in caught.value.message
