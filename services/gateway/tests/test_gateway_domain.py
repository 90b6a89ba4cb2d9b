"""Gateway domain logic over doubles of its ports (the gRPC adapters are tested against the
real services in test_gateway_api.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from hippo_core.errors import InvalidArgument, Unauthenticated
from hippo_gateway.domain import ids
from hippo_gateway.domain.auth import Authenticator, digest
from hippo_gateway.domain.memory import ForgetTarget, MemoryService, QuerySpelling
from hippo_gateway.domain.models import (
    Embedding,
    Memory,
    Mode,
    Recalled,
    RecallQuery,
    Role,
    TurnIn,
    TurnToStore,
    Vectors,
)


class FakeEmbedder:
    def __init__(self, model: str = "fake-model-v2") -> None:
        self.calls: list[list[str]] = []
        self.model = model

    async def embed(self, texts: Sequence[str]) -> Embedding:
        self.calls.append(list(texts))
        return Embedding(np.full((len(texts), 4), 0.5, np.float32), self.model)


class FakeStore:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], TurnToStore] = {}
        self.deletes: list[tuple[str, str, str | None, list[str]]] = []
        self.searches: list[tuple[Vectors | None, str]] = []
        self.queries: list[str] = []
        self.repairs: list[tuple[tuple[str, str], ...]] = []

    async def write(
        self, tenant: str, turns: Sequence[TurnToStore], wait_searchable: bool = False
    ) -> list[tuple[Memory, bool]]:
        out = []
        for t in turns:
            new = (tenant, t.memory_id) not in self.rows
            self.rows.setdefault((tenant, t.memory_id), t)
            m = self.rows[(tenant, t.memory_id)]
            memory = Memory(
                m.memory_id,
                m.user,
                m.session,
                m.role,
                m.text,
                m.time_us,
                m.client_id,
                m.metadata,
                0,
            )
            out.append((memory, new))
        return out

    async def search(
        self, tenant: str, query: RecallQuery, vector: Vectors | None, vector_model: str = ""
    ) -> Recalled:
        self.searches.append((vector, vector_model))
        self.queries.append(query.query)
        self.repairs.append(query.repairs)
        return Recalled([], 0, 0)

    async def delete(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> list[str]:
        self.deletes.append((tenant, user, session, list(memory_ids)))
        return list(memory_ids)


@pytest.fixture
def parts() -> tuple[FakeEmbedder, FakeStore, MemoryService]:
    embedder, store = FakeEmbedder(), FakeStore()
    return embedder, store, MemoryService(embedder, store, clock=lambda: 42)


def test_ids_are_deterministic_per_scope_and_client_id() -> None:
    a = ids.memory_id("t1", "u1", "s1", client_id="D1:3")
    assert a == ids.memory_id("t1", "u1", "s1", client_id="D1:3")
    assert a != ids.memory_id("t2", "u1", "s1", client_id="D1:3")  # other tenant, other id
    assert a != ids.memory_id("t1", "u2", "s1", client_id="D1:3")
    assert a != ids.memory_id("t1", "u1", "s1", idempotency_key="D1:3")
    k0 = ids.memory_id("t1", "u1", "s1", idempotency_key="req-9", position=0)
    assert k0 == ids.memory_id("t1", "u1", "s1", idempotency_key="req-9", position=0)
    assert k0 != ids.memory_id("t1", "u1", "s1", idempotency_key="req-9", position=1)
    assert ids.memory_id("t1", "u1", "s1") != ids.memory_id("t1", "u1", "s1")  # no key: fresh


async def test_remember_times_ids_and_dedup(parts) -> None:  # type: ignore[no-untyped-def]
    embedder, store, service = parts
    turns = [TurnIn(Role.USER, "a", client_id="c1"), TurnIn(Role.ASSISTANT, "b", time_us=7)]
    first = await service.remember("t", "u", "s", turns, "k1")
    again = await service.remember("t", "u", "s", turns, "k1")
    assert (first.created, again.created, again.deduplicated) == (2, 0, 2)
    assert first.memory_ids == again.memory_ids
    stored = [store.rows[("t", m)] for m in first.memory_ids]
    assert [s.time_us for s in stored] == [42, 7]  # receive time unless given
    assert embedder.calls[0] == ["a", "b"]


async def test_validation_happens_before_any_work(parts) -> None:  # type: ignore[no-untyped-def]
    embedder, store, service = parts
    with pytest.raises(InvalidArgument, match=r"turns\[1\]\.text: 32769 bytes"):
        await service.remember(
            "t", "u", "s", [TurnIn(Role.USER, "ok"), TurnIn(Role.USER, "é" * 16384 + "x")], ""
        )
    with pytest.raises(InvalidArgument, match=r"scope\.user_id: may only hold"):
        await service.remember("t", "ü", "s", [TurnIn(Role.USER, "x")], "")
    with pytest.raises(InvalidArgument, match="idempotency_key"):
        await service.remember("t", "u", "s", [TurnIn(Role.USER, "x")], "a b")
    # NUL: PostgreSQL text cannot hold it, so no engine gets it.
    with pytest.raises(InvalidArgument, match=r"turns\[0\]\.text: must not contain NUL"):
        await service.remember("t", "u", "s", [TurnIn(Role.USER, "a\x00b")], "")
    nul_meta = TurnIn(Role.USER, "x", metadata={"speaker": "B\x00b"})
    with pytest.raises(InvalidArgument, match=r"turns\[0\]\.metadata\[speaker\]: must not"):
        await service.remember("t", "u", "s", [nul_meta], "")
    assert embedder.calls == [] and store.rows == {}


async def test_lexical_recall_does_not_embed(parts) -> None:  # type: ignore[no-untyped-def]
    embedder, _, service = parts
    await service.recall("t", RecallQuery(user="u", query="q", mode=Mode.LEXICAL))
    assert embedder.calls == []
    await service.recall("t", RecallQuery(user="u", query="q", mode=Mode.HYBRID))
    assert embedder.calls == [["q"]]


async def test_remember_embeds_speaker_and_text_and_stores_the_embeddings_model(parts) -> None:  # type: ignore[no-untyped-def]
    """Each vector reaches the turn store with the model that made it (the retrieval
    service keys vectors by model, and re-embeds one of another model than its index's)."""
    embedder, store, service = parts
    turns = [TurnIn(Role.USER, "we adopted a puppy", metadata={"speaker": " Caroline "})]
    done = await service.remember("t", "u", "s", turns)
    assert embedder.calls == [["Caroline: we adopted a puppy"]]  # hippo_core's vector_text
    stored = store.rows[("t", done.memory_ids[0])]
    assert stored.vector_model == "fake-model-v2" and stored.vector is not None


async def test_recall_searches_with_the_query_vectors_model(parts) -> None:  # type: ignore[no-untyped-def]
    embedder, store, service = parts
    embedder.model = "other-model"
    await service.recall("t", RecallQuery(user="u", query="q", mode=Mode.SEMANTIC))
    await service.recall("t", RecallQuery(user="u", query="q", mode=Mode.LEXICAL))
    (vector, model), (no_vector, no_model) = store.searches
    assert vector is not None and vector.shape == (4,) and model == "other-model"
    assert no_vector is None and no_model == ""  # lexical: nothing embedded, no model


def fake_spell(text: str) -> tuple[str, dict[str, str]]:
    """The speller's contract (domain/spelling.py) for one slip."""
    return text.replace("reserch", "research"), (
        {"reserch": "research"} if "reserch" in text else {}
    )


@pytest.mark.parametrize("lexical", ["words", "repaired", "typed"])
async def test_the_repaired_query_is_embedded_and_bm25_searches_as_the_mode_says(lexical) -> None:  # type: ignore[no-untyped-def]
    """domain/spelling.py's repair: always what the embedder sees. What the turn store
    searches (BM25, the speaker step), by HIPPO_GATEWAY_QUERY_SPELLING: words: the typed
    query with the repairs beside it (the retrieval service picks per word); all: the
    repaired query; vector: the typed query alone."""
    embedder, store = FakeEmbedder(), FakeStore()
    service = MemoryService(embedder, store, spelling=QuerySpelling(fake_spell, lexical=lexical))
    await service.recall("t", RecallQuery(user="u", query="wat did she reserch", mode=Mode.HYBRID))
    await service.recall("t", RecallQuery(user="u", query="reserch", mode=Mode.LEXICAL))
    await service.recall("t", RecallQuery(user="u", query="no slips here", mode=Mode.HYBRID))
    assert embedder.calls == [["wat did she research"], ["no slips here"]]  # lexical: none
    if lexical == "repaired":
        assert store.queries == ["wat did she research", "research", "no slips here"]
    else:
        assert store.queries == ["wat did she reserch", "reserch", "no slips here"]
    pairs = (("reserch", "research"),) if lexical == "words" else ()
    assert store.repairs == [pairs, pairs, ()]


async def test_the_audit_entry_fingerprints_the_query_as_typed() -> None:
    class Audit:
        def __init__(self) -> None:
            self.queries: list[str] = []

        async def recalled(self, tenant: str, query: RecallQuery, result: Recalled) -> None:
            self.queries.append(query.query)

    audit = Audit()
    spelling = QuerySpelling(fake_spell, lexical="repaired")
    service = MemoryService(FakeEmbedder(), FakeStore(), audit=audit, spelling=spelling)  # type: ignore[arg-type]
    await service.recall("t", RecallQuery(user="u", query="wat did she reserch"))
    assert audit.queries == ["wat did she reserch"]


async def test_an_empty_id_list_never_forgets_the_whole_user(parts) -> None:  # type: ignore[no-untyped-def]
    _, store, service = parts
    with pytest.raises(InvalidArgument, match=r"memory_ids\.memory_ids: must hold 1\.\.1000"):
        await service.forget("t", ForgetTarget(kind="memories", user="u", memory_ids=[]))
    assert store.deletes == []
    await service.forget("t", ForgetTarget(kind="user", user="u"))
    assert store.deletes == [("t", "u", None, [])]


class FakeMemtoks:
    """Unit-test double of the memtok store port; the real adapter (the injection
    service's ForgetUser) is exercised by tests/test_cluster.py."""

    def __init__(self) -> None:
        self.erased: list[tuple[str, str]] = []

    async def forget_user(self, tenant: str, user: str) -> int:
        self.erased.append((tenant, user))
        return 3


async def test_forgetting_a_user_erases_their_memtoks_and_nothing_less_does() -> None:
    memtoks = FakeMemtoks()
    service = MemoryService(FakeEmbedder(), FakeStore(), memtoks=memtoks)
    session = await service.forget("t", ForgetTarget(kind="session", user="u", session="s"))
    some = await service.forget("t", ForgetTarget(kind="memories", user="u", memory_ids=["m"]))
    assert memtoks.erased == [] and session.memtoks == some.memtoks == 0
    whole = await service.forget("t", ForgetTarget(kind="user", user="u"))
    assert memtoks.erased == [("t", "u")] and whole.memtoks == 3


def test_api_keys_map_to_tenants() -> None:
    auth = Authenticator({"plain-key": "acme", f"sha256:{digest('hashed-key')}": "globex"})
    assert auth.caller([("x-api-key", "plain-key")], "Recall").tenant == "acme"
    assert auth.caller([("authorization", "Bearer hashed-key")], "Recall").tenant == "globex"
    assert auth.caller([("authorization", "bearer  plain-key ")], "Recall").tenant == "acme"
    for metadata in (
        [],
        [("x-api-key", "nope")],
        [("authorization", "Basic x")],
        [("x-api-key", "")],
    ):
        with pytest.raises(Unauthenticated):
            auth.caller(metadata, "Recall")
    with pytest.raises(ValueError, match="tenant"):
        Authenticator({"k": "bad tenant"})
