"""Switching the embedding model online, over the real stores (SQLite, Tantivy,
qdrant-edge): a reindex that names another model re-embeds every turn into the new
generation while the old one serves; writes and queries that still come with the old
model's vectors are embedded again here; the new vectors are kept for the next rebuild.

The embedder is a test double of the `Embedder` port (two deterministic "models" of
different dimensions, counting what they were asked); the real adapter is exercised
against the real embedding service in tests/test_embedder_switch.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from hippo_core.errors import FailedPrecondition, InvalidArgument
from hippo_retrieval.adapters.generations import LocalIndexSet
from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
from hippo_retrieval.domain.models import EmbeddingModel, Mode, NewTurn, Role, Scope
from hippo_retrieval.domain.retriever import FusionConfig
from hippo_retrieval.domain.service import ProjectionConfig, RetrievalService
from hippo_retrieval.domain.validation import Limits

OLD = EmbeddingModel("old-8", 8)
NEW = EmbeddingModel("new-4", 4)


def vector(text: str, model: EmbeddingModel) -> np.ndarray:
    """A unit vector that depends on the text and the model only."""
    seed = int.from_bytes(hashlib.blake2b(f"{model.name}|{text}".encode()).digest()[:8], "big")
    v = np.random.default_rng(seed).normal(size=model.dimension).astype(np.float32)
    return v / np.linalg.norm(v)


class TwoModels:
    """Test double of the embedding service with OLD (the default) and NEW loaded."""

    def __init__(self) -> None:
        self.texts: dict[str, list[str]] = {OLD.name: [], NEW.name: []}

    def models(self) -> list[EmbeddingModel]:
        return [OLD, NEW]

    def embed(self, texts: Sequence[str], model: str) -> np.ndarray:
        which = {OLD.name: OLD, NEW.name: NEW}[model]
        self.texts[model] += list(texts)
        return np.stack([vector(t, which) for t in texts])


def turn(text: str, *, speaker: str = "") -> NewTurn:
    metadata = {"speaker": speaker} if speaker else {}
    embedded = f"{speaker}: {text}" if speaker else text  # hippo_core.embedding.vector_text
    return NewTurn(
        memory_id=str(uuid.uuid4()),
        tenant="t1",
        user="u1",
        session="s1",
        role=Role.USER,
        text=text,
        time_us=1_700_000_000_000_000,
        metadata=metadata,
        vector=vector(embedded, OLD),
        vector_model=OLD.name,
    )


def make(root: Path, embedder: TwoModels | None) -> RetrievalService:
    return RetrievalService(
        SqliteTurnStore(root / "turns.sqlite3"),
        LocalIndexSet(root),
        fusion=FusionConfig(),
        projection=ProjectionConfig(commit_interval_s=0.1, purge_delay_s=None),
        limits=Limits(max_turns=64, dimension=OLD.dimension),
        threads=2,
        embedding=OLD,
        embedder=embedder,
    )


async def test_a_reindex_with_another_model_switches_while_searches_continue(
    tmp_path: Path,
) -> None:
    embedder = TwoModels()
    service = make(tmp_path, embedder)
    service.open()
    scope = Scope("t1", "u1")
    try:
        turns = [turn(f"note {i} about topic{i % 5}", speaker="Ann") for i in range(120)]
        for start in range(0, len(turns), 40):
            await service.write("t1", turns[start : start + 40], True, timeout=5.0)
        assert service.status().embedding_model == OLD.name
        assert embedder.texts[NEW.name] == []  # stored vectors served generation 1

        stop = asyncio.Event()
        late: list[NewTurn] = []
        answered = 0

        async def keep_busy() -> None:
            # A caller that has not learnt of the switch: OLD vectors throughout.
            nonlocal answered
            i = 0
            while not stop.is_set():
                t = turn(f"late write {i} topic3")
                await service.write("t1", [t], False, None)
                late.append(t)
                q = "topic3"
                result = await service.search(
                    scope, q, vector(q, OLD), Mode.HYBRID, 10, vector_model=OLD.name
                )
                answered += bool(result.hits)
                i += 1
                await asyncio.sleep(0.005)

        busy = asyncio.create_task(keep_busy())
        reports = [p async for p in service.reindex(NEW.name)]
        await asyncio.sleep(0.1)  # writes after the switch, with the old model still
        stop.set()
        await busy

        last = reports[-1]
        assert last.done and last.embedding_model == NEW.name
        assert last.embedded >= len(turns)
        assert answered == len(late)  # every search during the switch found something
        status = service.status()
        assert (status.embedding_model, status.dimension, status.generation) == (NEW.name, 4, 2)
        # Every turn was embedded with the new model as the gateway embeds it.
        assert {f"Ann: {t.text}" for t in turns} <= set(embedder.texts[NEW.name])

        # The new index answers a NEW query vector with the turn it was built from...
        target = turns[17]
        hits = (
            await service.search(
                scope, "", vector(f"Ann: {target.text}", NEW), Mode.SEMANTIC, 1, NEW.name
            )
        ).hits
        assert hits[0].turn.memory_id == target.memory_id
        # ... and an OLD one is embedded again here rather than refused.
        before = len(embedder.texts[NEW.name])
        result = await service.search(
            scope, target.text, vector(target.text, OLD), Mode.HYBRID, 5, OLD.name
        )
        assert result.embedding_model == NEW.name and result.hits
        assert embedder.texts[NEW.name][before:] == [target.text]

        # Writes made with the old model after the switch are in the new index too.
        straggler = turn("a straggler written with the old model")
        written = await service.write("t1", [straggler], True, timeout=5.0)
        assert written.searchable and written.embedding_model == NEW.name
        found = await service.search(
            scope, "", vector(straggler.text, NEW), Mode.SEMANTIC, 1, NEW.name
        )
        assert found.hits[0].turn.memory_id == straggler.memory_id
        for t in late:
            got = await service.search(scope, "", vector(t.text, NEW), Mode.SEMANTIC, 1, NEW.name)
            assert got.hits[0].turn.memory_id == t.memory_id

        # A rebuild with the same model (a purge after an erasure) embeds nothing again.
        count = len(embedder.texts[NEW.name])
        again = [p async for p in service.reindex()]
        assert again[-1].embedded == 0 and again[-1].embedding_model == NEW.name
        assert len(embedder.texts[NEW.name]) == count
    finally:
        service.close()

    reopened = make(tmp_path, embedder)  # the recorded model survives a restart
    try:
        reopened.open()
        assert reopened.status().embedding_model == NEW.name
        assert reopened.status().dimension == NEW.dimension
    finally:
        reopened.close()


async def test_switch_requests_that_cannot_work_are_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    service = make(tmp_path, TwoModels())
    service.open()
    try:
        await service.write("t1", [turn("one")], True, timeout=2.0)
        with pytest.raises(InvalidArgument) as refused:
            await service.reindex("not-loaded").__anext__()
        assert refused.value.field == "embedding_model"
        assert "old-8" in str(refused.value) and "new-4" in str(refused.value)
        assert service.status().generation == 1
    finally:
        service.close()

    lonely = make(tmp_path / "none", None)  # no embedding service configured
    lonely.open()
    try:
        with pytest.raises(FailedPrecondition) as no_embedder:
            await lonely.reindex(NEW.name).__anext__()
        assert no_embedder.value.reason == "EMBEDDING_MODEL"
        other = turn("written with another model")
        other = NewTurn(
            **{**other.__dict__, "vector": np.ones(4, np.float32) / 2, "vector_model": "x"}
        )
        with pytest.raises(FailedPrecondition):
            await lonely.write("t1", [other], False, None)
        assert lonely.status().turns == 0  # refused before anything was written
        ok = await lonely.write("t1", [turn("the live model's vector")], True, timeout=2.0)
        assert ok.searchable
        with pytest.raises(InvalidArgument) as wrong:  # the live model, the wrong size
            bad = NewTurn(**{**turn("bad").__dict__, "vector": np.ones(3, np.float32)})
            await lonely.write("t1", [bad], False, None)
        assert wrong.value.reason == "DIMENSION"
    finally:
        lonely.close()


async def test_an_erased_turns_other_model_vectors_go_with_it(tmp_path: Path) -> None:
    embedder = TwoModels()
    service = make(tmp_path, embedder)
    service.open()
    try:
        keep, erase = turn("keep this one"), turn("erase this one")
        await service.write("t1", [keep, erase], True, timeout=2.0)
        _ = [p async for p in service.reindex(NEW.name)]
        store = SqliteTurnStore(tmp_path / "turns.sqlite3")
        try:
            keys = [("t1", keep.memory_id), ("t1", erase.memory_id)]
            assert set(store.model_vectors(NEW.name, keys)) == set(keys)
            await service.delete("t1", "u1", None, [erase.memory_id], timeout=2.0)
            assert set(store.model_vectors(NEW.name, keys)) == {keys[0]}
        finally:
            store.close()
    finally:
        service.close()
