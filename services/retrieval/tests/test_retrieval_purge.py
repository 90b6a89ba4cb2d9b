"""The purge after an erasure: a deleted turn's terms and vector leave the index files
within the purge delay plus one rebuild, on the real stores (SQLite, Tantivy, qdrant-edge).

A deletion alone leaves both in the segments (Tantivy's term dictionary counts the deleted
document, the vector engine keeps the vector's bytes): each test first shows that, so it
can fail, then that the rebuild removed them."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import numpy as np
import tantivy

from hippo_retrieval.adapters.generations import LocalIndexSet
from hippo_retrieval.adapters.sparse_lexical import EXACT_SPACE, term_id
from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
from hippo_retrieval.domain.models import Mode, NewTurn, Role, Scope
from hippo_retrieval.domain.retriever import FusionConfig
from hippo_retrieval.domain.service import ProjectionConfig, RetrievalService
from hippo_retrieval.domain.validation import Limits

DIM = 8
CANARY = "zqvcanary7k3x"


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def turn(text: str, seed: int, user: str = "u1") -> NewTurn:
    return NewTurn(
        memory_id=str(uuid.uuid4()),
        tenant="t1",
        user=user,
        session="s1",
        role=Role.USER,
        text=text,
        time_us=1_700_000_000_000_000,
        vector=unit(seed),
    )


def make(root: Path, delay: float | None, lexical: str = "tantivy") -> RetrievalService:
    return RetrievalService(
        SqliteTurnStore(root / "turns.sqlite3"),
        LocalIndexSet(root, lexical=lexical),
        fusion=FusionConfig(),
        projection=ProjectionConfig(commit_interval_s=0.1, purge_delay_s=delay),
        limits=Limits(max_turns=64, dimension=DIM),
        threads=2,
    )


def files_holding(root: Path, needle: bytes) -> list[Path]:
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if needle in path.read_bytes():
                found.append(path)
    return found


def lexical_doc_freq(root: Path, term: str) -> int:
    """Documents holding `term` in the live generation, deleted ones included (Tantivy's
    term dictionary only forgets them when the segment is rewritten)."""
    generation = (
        (root / "indexes" / "CURRENT").read_text().strip()
        if (root / "indexes" / "CURRENT").exists()
        else "1"
    )
    index = tantivy.Index.open(str(root / "indexes" / f"g{int(generation):06d}" / "lexical"))
    return int(index.searcher().doc_freq("exact", term))


async def wait_until(check, timeout: float) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "not purged in time"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def test_an_erased_turn_leaves_the_index_files_within_the_purge_delay(
    tmp_path: Path,
) -> None:
    service = make(tmp_path, delay=0.5)
    service.open()
    try:
        secret = turn(f"my locker code is {CANARY} ok", seed=99)
        kept = [turn(f"ordinary note number {i}", seed=i) for i in range(20)]
        other = turn(f"someone else says {CANARY}", seed=98, user="u2")
        await service.write("t1", [*kept, secret, other], wait_searchable=True, timeout=5)
        canary_vector = unit(99).tobytes()
        assert lexical_doc_freq(tmp_path, CANARY) == 2
        assert files_holding(tmp_path / "indexes", canary_vector)

        assert await service.delete("t1", "u1", None, [secret.memory_id], timeout=5) == [
            secret.memory_id
        ]
        # Erased and unsearchable, but still in the files: what the purge is for.
        assert lexical_doc_freq(tmp_path, CANARY) == 2
        assert files_holding(tmp_path / "indexes", canary_vector)
        assert (tmp_path / "indexes" / "PURGE").exists()

        took = await wait_until(
            lambda: (
                not (tmp_path / "indexes" / "PURGE").exists()
                and lexical_doc_freq(tmp_path, CANARY) == 1
            ),
            timeout=30,
        )
        assert took >= 0.4  # not before the delay
        assert not files_holding(tmp_path, canary_vector)  # nor in the turn store
        assert service.status().generation == 2
        # What was not erased is still found, by words and by vector.
        scope = Scope("t1", "u1")
        lexical = await service.search(scope, "ordinary note number 7", None, Mode.LEXICAL, 3)
        # kept[8]'s document quotes kept[7] (the previous turn): the two score alike.
        assert kept[7].memory_id in [h.turn.memory_id for h in lexical.hits[:2]]
        semantic = await service.search(scope, "", unit(3), Mode.SEMANTIC, 1)
        assert semantic.hits[0].turn.memory_id == kept[3].memory_id
        other_hits = await service.search(Scope("t1", "u2"), CANARY, None, Mode.LEXICAL, 3)
        assert [h.turn.memory_id for h in other_hits.hits] == [other.memory_id]
    finally:
        service.close()


async def test_erasures_within_the_delay_share_one_rebuild(tmp_path: Path) -> None:
    service = make(tmp_path, delay=0.5)
    service.open()
    try:
        turns = [turn(f"note {i}", seed=i) for i in range(6)]
        await service.write("t1", turns, wait_searchable=True, timeout=5)
        for t in turns[:3]:
            await service.delete("t1", "u1", None, [t.memory_id], timeout=5)
        await wait_until(lambda: not (tmp_path / "indexes" / "PURGE").exists(), timeout=30)
        await asyncio.sleep(0.8)  # no second rebuild is pending
        assert service.status().generation == 2
    finally:
        service.close()


async def test_a_purge_the_last_run_did_not_reach_runs_after_a_restart(tmp_path: Path) -> None:
    service = make(tmp_path, delay=3600)  # never within this run
    service.open()
    secret = turn(f"remember {CANARY}", seed=99)
    await service.write("t1", [secret, turn("a kept note", seed=1)], True, timeout=5)
    await service.delete("t1", "u1", None, [secret.memory_id], timeout=5)
    service.close()
    assert (tmp_path / "indexes" / "PURGE").exists()
    # (Tantivy may merge the small segments on close; the vector engine keeps the bytes.)
    assert files_holding(tmp_path / "indexes", unit(99).tobytes())

    again = make(tmp_path, delay=0.2)
    again.open()
    try:
        await wait_until(lambda: not (tmp_path / "indexes" / "PURGE").exists(), timeout=30)
        assert lexical_doc_freq(tmp_path, CANARY) == 0
        assert not files_holding(tmp_path, unit(99).tobytes())
    finally:
        again.close()


async def test_without_a_purge_delay_nothing_is_rebuilt(tmp_path: Path) -> None:
    service = make(tmp_path, delay=None)
    service.open()
    try:
        t = turn("short lived", seed=1)
        await service.write("t1", [t], True, timeout=5)
        await service.delete("t1", "u1", None, [t.memory_id], timeout=5)
        await asyncio.sleep(0.3)
        assert service.status().generation == 1
        assert not (tmp_path / "indexes" / "PURGE").exists()
    finally:
        service.close()


async def test_an_erased_turn_leaves_the_sparse_bm25_shard_too(tmp_path: Path) -> None:
    """lexical_index=qdrant: the BM25 edge shard keeps a deleted point's sparse vector
    (its terms' dimensions) until the rebuild, like the vector shard."""
    service = make(tmp_path, delay=0.5, lexical="qdrant")
    service.open()
    try:
        secret = turn(f"my locker code is {CANARY} ok", seed=99)
        kept = [turn(f"ordinary note number {i}", seed=i) for i in range(20)]
        await service.write("t1", [*kept, secret], wait_searchable=True, timeout=5)
        # The canary's dimension, as the engine's WAL holds it (CBOR: big-endian u32).
        dimension = term_id(EXACT_SPACE, CANARY).to_bytes(4, "big")
        shards = tmp_path / "indexes"
        assert any("lexical-sparse" in str(p) for p in files_holding(shards, dimension))
        await service.delete("t1", "u1", None, [secret.memory_id], timeout=5)
        hits = (await service.search(Scope("t1", "u1"), CANARY, None, Mode.LEXICAL, 5)).hits
        assert hits == []
        assert any("lexical-sparse" in str(p) for p in files_holding(shards, dimension))
        await wait_until(
            lambda: (
                not (shards / "PURGE").exists()
                and not any("lexical-sparse" in str(p) for p in files_holding(shards, dimension))
            ),
            timeout=30,
        )
        assert service.status().generation == 2
        assert service.status().lexical_backend == "qdrant"
    finally:
        service.close()
