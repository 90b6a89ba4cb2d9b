"""The LexicalIndex contract, for both adapters: TantivyIndex (a real on-disk Tantivy
index) and the BM25 index on Qdrant sparse vectors, in the in-process engine
(EdgeLexicalIndex) and through qdrant-client (QdrantLexicalIndex over its local mode,
which speaks a server's API), and the BM25 side of the collection that holds both vectors
(hybrid_collection.OneCollection, driven as the projector drives it: the lexical side's
apply, then the vector side's), all in tmp_path.

Covers: exact identifiers found (and ranked first) by their exact form, stemming, hostile
query text searched as plain words and never leaving the scope, tenancy under duplicated
texts (property test), session/role/time filters, deletions, idempotent re-application,
applied_seq durability, and visibility after commit (only after it, for Tantivy).
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import memory_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qdrant_client import QdrantClient

from hippo_retrieval.adapters.edge_vectors import ShardLockedError
from hippo_retrieval.adapters.hybrid_collection import OneCollection, QdrantHybridIndex
from hippo_retrieval.adapters.sparse_lexical import EdgeLexicalIndex, QdrantLexicalIndex
from hippo_retrieval.adapters.tantivy_index import IndexLockedError, TantivyIndex
from hippo_retrieval.domain.models import (
    Candidate,
    Change,
    Deletion,
    Role,
    Scope,
    StoredTurn,
    metadata_term,
)

TENANT = "acme"
USER = "alice"
SCOPE = Scope(tenant=TENANT, user=USER)


def turn(
    seq: int,
    text: str,
    *,
    tenant: str = TENANT,
    user: str = USER,
    session: str = "s1",
    role: Role = Role.USER,
    time_us: int | None = None,
    mid: str | None = None,
) -> StoredTurn:
    return StoredTurn(
        seq=seq,
        memory_id=mid or memory_id(tenant, user, session, client_id=f"c{seq}"),
        tenant=tenant,
        user=user,
        session=session,
        role=role,
        text=text,
        time_us=1_700_000_000_000_000 + seq if time_us is None else time_us,
        client_id=f"c{seq}",
        metadata={},
        vector=None,
    )


def ids(hits: Sequence[Candidate]) -> list[str]:
    return [h.memory_id for h in hits]


class BothSides:
    """The lexical port of a OneCollection, each apply handed to both of its sides in the
    projector's order (the lexical side holds the documents, the vector side writes)."""

    def __init__(self, path: Path, *, typos: bool = False) -> None:
        index = QdrantHybridIndex(QdrantClient(path=str(path)), "fused", 8, typos=typos)
        self._pair = OneCollection(index, index)

    def apply(self, changes: Sequence[Change]) -> None:
        self._pair.lexical.apply(changes)
        self._pair.vectors.apply(changes)

    def commit(self) -> None:
        self._pair.lexical.commit()

    def applied_seq(self) -> int:
        return self._pair.lexical.applied_seq()

    def search(
        self,
        scope: Scope,
        query: str,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        return self._pair.lexical.search(scope, query, limit, query_repairs)

    def close(self) -> None:
        self._pair.lexical.close()
        self._pair.vectors.close()


Lexical = TantivyIndex | EdgeLexicalIndex | QdrantLexicalIndex | BothSides
KINDS = ["tantivy", "qdrant-edge", "qdrant-local", "qdrant-fused"]


def open_lexical(kind: str, path: Path, *, typos: bool = False) -> Lexical:
    if kind == "tantivy":
        return TantivyIndex(path, typos=typos)
    if kind == "qdrant-edge":
        return EdgeLexicalIndex(path, typos=typos)
    if kind == "qdrant-fused":
        return BothSides(path, typos=typos)
    return QdrantLexicalIndex(QdrantClient(path=str(path)), "lexical", typos=typos)


@pytest.fixture(params=KINDS)
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Lexical]:
    ix = open_lexical(request.param, tmp_path / "lexical")
    yield ix
    ix.close()


def load(ix: Lexical, changes: Sequence[Change]) -> None:
    ix.apply(changes)
    ix.commit()


# -- exact identifiers ---------------------------------------------------------------------

IDENTIFIER_CASES = [
    pytest.param(
        "handleSubmit",
        "the crash is inside handleSubmit( when the form posts twice",
        [
            "handle the submit button click",
            "we handled submit events in the old form",
            "handleSubmitted fires after the form posts",
            "the form posts twice when submit is slow",
        ],
        id="camelCase",
    ),
    pytest.param(
        "ERR_CONNECTION_REFUSED",
        "Chrome shows ERR_CONNECTION_REFUSED: on localhost:3000",
        [
            "the connection was refused, err on the side of caution",
            "ERR_CONNECTION_RESET on localhost again",
            "err connection refused connection refused",
            "ERR_CONNECTION_REFUSED_BY_PROXY is a different one",
        ],
        id="SCREAMING_SNAKE",
    ),
    pytest.param(
        "v2.14.1",
        "we pinned the client to v2.14.1 yesterday",
        [
            "v2.14.2 fixed the regression",
            "version v2 had 14 bugs and 1 crash",
            "v2.1.14 was the previous pin",
            "v1.14.1 is too old, v2 is new",
        ],
        id="version",
    ),
    pytest.param(
        "src/app/main.py",
        'the entry point is "src/app/main.py", line 42',
        [
            "src/app/models.py is the main app module",
            "the main app lives in src, written in py",
            "tests/app/main.py covers it",
            "src/app/main.pyc is stale, src app main py",
        ],
        id="path",
    ),
]


@pytest.mark.parametrize(("identifier", "target", "distractors"), IDENTIFIER_CASES)
@pytest.mark.parametrize("wrap", ["{}", "where is {} defined?", "`{}`", "({})", "{}:"])
def test_exact_identifier_ranks_its_turn_first(
    index: Lexical, identifier: str, target: str, distractors: list[str], wrap: str
) -> None:
    turns = [turn(1, target)] + [turn(i + 2, d) for i, d in enumerate(distractors)]
    load(index, turns)
    hits = index.search(SCOPE, wrap.format(identifier), 10)
    assert hits, "the exact identifier found nothing"
    assert hits[0].memory_id == turns[0].memory_id
    assert all(h.score < hits[0].score for h in hits[1:]), "target must win outright"


def test_identifier_found_case_insensitively(index: Lexical) -> None:
    target = turn(1, "call handleSubmit now")
    load(index, [target, turn(2, "handle submit")])
    assert ids(index.search(SCOPE, "HANDLESUBMIT", 5))[:1] == [target.memory_id]


def test_stemming_matches_other_word_forms(index: Lexical) -> None:
    runs = turn(1, "she runs every morning")
    other = turn(2, "he swims every evening")
    load(index, [runs, other])
    assert ids(index.search(SCOPE, "running", 10)) == [runs.memory_id]
    assert ids(index.search(SCOPE, "swimming", 10)) == [other.memory_id]


def test_scores_are_best_first(index: Lexical) -> None:
    load(
        index,
        [turn(1, "deploy"), turn(2, "deploy deploy the deploy"), turn(3, "nothing relevant")],
    )
    hits = index.search(SCOPE, "deploy", 10)
    assert len(hits) == 2
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(h.score > 0 for h in hits)


# -- hostile query text --------------------------------------------------------------------

IN_SCOPE_TEXTS = {
    "A": "handleSubmit( throws on submit",
    "B": "got ERR_CONNECTION_REFUSED: from the api",
    "C": "the user_id:x field is empty",
    "D": "plain words only",
}

# query -> the in-scope turns it must find exactly (None: only "never out of scope").
HOSTILE: list[tuple[str, set[str] | None]] = [
    ("handleSubmit(", {"A"}),
    ("ERR_CONNECTION_REFUSED:", {"B"}),
    ('"handleSubmit', {"A"}),
    ("plain words'", {"D"}),
    ("AND OR NOT", set()),
    ("plain AND", {"D"}),
    ("NOT plain", {"D"}),
    ("+plain -words", {"D"}),
    ("plain~2 words*", {"D"}),
    ("plain^100", {"D"}),
    ("*", set()),
    ("~", set()),
    ("?*~^:()[]{}\"'\\/!+-&|", set()),
    ("😀🔥🚀", set()),
    ("", set()),
    ("   \t\n", set()),
    ("\x00", set()),
    ("a\ud800b", set()),
    ("user_id:x", {"C"}),
    ("tenant:globex", set()),
    ("user_id:bob", {"C"}),  # the words "user" and "id" are in C; bob is out of scope
    ("text:plain", {"D"}),
    ("[1 TO 9]", set()),
    ('memory_id:"x" OR *:*', None),
    ("plain " * 2000, {"D"}),  # 12 KB of one word
    ("(((" * 4000, set()),  # 12 KB of punctuation
    (" ".join(f"word{i}" for i in range(1500)) + " handleSubmit", {"A"}),  # 12 KB of terms
]


@pytest.fixture
def hostile_index(index: Lexical) -> tuple[Lexical, dict[str, str]]:
    changes: list[Change] = []
    names: dict[str, str] = {}
    seq = 0
    for name, text in IN_SCOPE_TEXTS.items():
        seq += 1
        t = turn(seq, text)
        names[t.memory_id] = name
        changes.append(t)
    # The same texts (and texts naming the scope fields) for other tenants and users.
    for tenant, user in [(TENANT, "bob"), ("globex", USER), ("globex", "bob"), (TENANT, "x")]:
        for text in [*IN_SCOPE_TEXTS.values(), f"tenant:{tenant} user_id:{user} {tenant}"]:
            seq += 1
            t = turn(seq, text, tenant=tenant, user=user)
            names[t.memory_id] = "outside"
            changes.append(t)
    load(index, changes)
    return index, names


@pytest.mark.parametrize(("query", "expected"), HOSTILE, ids=lambda v: repr(v)[:30])
def test_hostile_query_is_plain_words_inside_scope(
    hostile_index: tuple[Lexical, dict[str, str]], query: str, expected: set[str] | None
) -> None:
    index, names = hostile_index
    for scope in [SCOPE, Scope(tenant=TENANT, user=USER, session="s1", roles=frozenset(Role))]:
        found = [names[m] for m in ids(index.search(scope, query, 100))]
        assert "outside" not in found
        assert len(found) == len(set(found))
        if expected is not None:
            assert set(found) == expected


def test_limit_zero_or_negative_returns_nothing(index: Lexical) -> None:
    load(index, [turn(1, "plain words")])
    assert index.search(SCOPE, "plain", 0) == []
    assert index.search(SCOPE, "plain", -3) == []
    assert len(index.search(SCOPE, "plain", 10**9)) == 1


def test_surrogates_in_turn_text_are_indexed(index: Lexical) -> None:
    t = turn(1, "broken \ud83d text survives")
    load(index, [t])
    assert ids(index.search(SCOPE, "survives", 5)) == [t.memory_id]


# -- tenancy property ----------------------------------------------------------------------

TENANTS = ["t1", "t2", "t3"]
USERS = ["u1", "u2"]
WORDS = ["alpha", "bravo", "charlie", "delta", "handleSubmit", "v2.14.1"]

# query -> the words a matching turn contains (the field-like parts match no turn text).
PROPERTY_QUERIES = [
    *((w, {w}) for w in WORDS),
    ("user_id:u1 alpha", {"alpha"}),
    (f"tenant:{TENANTS[0]} bravo", {"bravo"}),
    ("* OR delta", {"delta"}),
]

doc_strategy = st.tuples(
    st.sampled_from(TENANTS),
    st.sampled_from(USERS),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(doc_strategy, min_size=1, max_size=30))
@pytest.mark.parametrize("kind", KINDS)
def test_no_search_crosses_tenant_or_user(
    kind: str, docs: list[tuple[str, str, list[str]]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ix = open_lexical(kind, Path(tmp) / "lexical")
        try:
            turns = [
                turn(i + 1, " ".join(words), tenant=tenant, user=user)
                for i, (tenant, user, words) in enumerate(docs)
            ]
            load(ix, turns)
            for tenant in TENANTS:
                for user in USERS:
                    scope = Scope(tenant=tenant, user=user)
                    for query, words in PROPERTY_QUERIES:
                        expected = {
                            t.memory_id
                            for t in turns
                            if t.tenant == tenant and t.user == user and words & set(t.text.split())
                        }
                        got = ids(ix.search(scope, query, 1000))
                        assert len(got) == len(set(got))
                        assert set(got) == expected, (tenant, user, query)
        finally:
            ix.close()


# -- filters -------------------------------------------------------------------------------


@pytest.fixture
def filtered(index: Lexical) -> tuple[Lexical, dict[str, StoredTurn]]:
    docs = {
        "s1_user_100": turn(1, "deploy", session="s1", role=Role.USER, time_us=100),
        "s1_asst_200": turn(2, "deploy", session="s1", role=Role.ASSISTANT, time_us=200),
        "s2_tool_300": turn(3, "deploy", session="s2", role=Role.TOOL, time_us=300),
        "s2_sys_400": turn(4, "deploy", session="s2", role=Role.SYSTEM, time_us=400),
    }
    load(index, list(docs.values()))
    return index, docs


@pytest.mark.parametrize(
    ("scope_kwargs", "expected"),
    [
        ({}, {"s1_user_100", "s1_asst_200", "s2_tool_300", "s2_sys_400"}),
        ({"session": "s1"}, {"s1_user_100", "s1_asst_200"}),
        ({"session": "s2"}, {"s2_tool_300", "s2_sys_400"}),
        ({"session": "nope"}, set()),
        ({"roles": frozenset({Role.ASSISTANT})}, {"s1_asst_200"}),
        ({"roles": frozenset({Role.ASSISTANT, Role.TOOL})}, {"s1_asst_200", "s2_tool_300"}),
        ({"session": "s1", "roles": frozenset({Role.TOOL})}, set()),
        ({"start_us": 200, "end_us": 300}, {"s1_asst_200"}),  # start inclusive, end exclusive
        ({"start_us": 200, "end_us": 301}, {"s1_asst_200", "s2_tool_300"}),
        ({"start_us": 300}, {"s2_tool_300", "s2_sys_400"}),
        ({"end_us": 300}, {"s1_user_100", "s1_asst_200"}),
        ({"start_us": 400, "end_us": 100}, set()),
        ({"session": "s2", "roles": frozenset({Role.SYSTEM}), "start_us": 0}, {"s2_sys_400"}),
    ],
)
def test_scope_filters(
    filtered: tuple[Lexical, dict[str, StoredTurn]],
    scope_kwargs: dict[str, object],
    expected: set[str],
) -> None:
    index, docs = filtered
    by_id = {t.memory_id: name for name, t in docs.items()}
    scope = Scope(tenant=TENANT, user=USER, **scope_kwargs)  # type: ignore[arg-type]
    assert {by_id[m] for m in ids(index.search(scope, "deploy", 10))} == expected


def test_filters_do_not_change_the_score(
    filtered: tuple[Lexical, dict[str, StoredTurn]],
) -> None:
    index, _ = filtered
    plain = {h.memory_id: h.score for h in index.search(SCOPE, "deploy", 10)}
    narrowed = index.search(
        Scope(tenant=TENANT, user=USER, session="s1", start_us=0, roles=frozenset(Role)),
        "deploy",
        10,
    )
    assert narrowed
    for h in narrowed:
        assert h.score == pytest.approx(plain[h.memory_id])


# -- writes, deletions, idempotency --------------------------------------------------------


def test_everything_searchable_after_commit(index: Lexical) -> None:
    """Tantivy: nothing before it (a commit is a segment and an fsync, so the projector
    batches them); the sparse index writes through the engine's WAL, searchable at once."""
    turns = [turn(i, f"note number {i} about caching") for i in range(1, 51)]
    index.apply(turns)
    if isinstance(index, TantivyIndex):
        assert index.search(SCOPE, "caching", 100) == []
        assert index.applied_seq() == 0
    index.commit()
    assert set(ids(index.search(SCOPE, "caching", 100))) == {t.memory_id for t in turns}
    assert index.applied_seq() == 50


def test_deletion_takes_effect_after_commit(index: Lexical) -> None:
    keep, gone = turn(1, "deploy friday"), turn(2, "deploy monday")
    load(index, [keep, gone])
    index.apply([Deletion(seq=3, tenant=TENANT, memory_id=gone.memory_id)])
    if isinstance(index, TantivyIndex):
        assert set(ids(index.search(SCOPE, "deploy", 10))) == {keep.memory_id, gone.memory_id}
    index.commit()
    assert ids(index.search(SCOPE, "deploy", 10)) == [keep.memory_id]
    assert index.search(SCOPE, "monday", 10) == []
    assert index.applied_seq() == 3


def test_deletion_only_touches_its_own_tenant(index: Lexical) -> None:
    # Same memory_id in two tenants (not produced by ids.py, but must stay contained).
    mine = turn(1, "deploy", mid="shared-id")
    theirs = turn(2, "deploy", tenant="globex", mid="shared-id")
    load(index, [mine, theirs])
    load(index, [Deletion(seq=3, tenant="globex", memory_id="shared-id")])
    assert ids(index.search(SCOPE, "deploy", 10)) == ["shared-id"]
    assert index.search(Scope(tenant="globex", user=USER), "deploy", 10) == []
    # And a rewrite in one tenant does not replace the other tenant's document.
    load(index, [turn(4, "deploy again", tenant="globex", mid="shared-id")])
    assert ids(index.search(SCOPE, "deploy", 10)) == ["shared-id"]
    globex = ids(index.search(Scope(tenant="globex", user=USER), "again", 10))
    # Tantivy holds a document per (tenant, id); Qdrant a point per id, which a write of
    # another tenant cannot take over (so the forged one is not stored at all).
    assert globex == (["shared-id"] if isinstance(index, TantivyIndex) else [])


def test_reapplying_changes_is_idempotent(index: Lexical) -> None:
    turns = [turn(i, "duplicate text") for i in range(1, 6)]
    changes: list[Change] = [*turns, Deletion(seq=6, tenant=TENANT, memory_id=turns[0].memory_id)]
    index.apply(changes)
    index.apply(changes)  # twice before a commit
    index.commit()
    load(index, changes)  # and again after it (a projector replay)
    got = ids(index.search(SCOPE, "duplicate", 100))
    assert len(got) == len(set(got)) == 4
    assert set(got) == {t.memory_id for t in turns[1:]}
    assert index.applied_seq() == 6


def test_rewrite_replaces_the_document(index: Lexical) -> None:
    first = turn(1, "old wording", mid="m-1")
    load(index, [first])
    load(index, [turn(2, "new phrasing", mid="m-1")])
    assert index.search(SCOPE, "wording", 10) == []
    assert ids(index.search(SCOPE, "phrasing", 10)) == ["m-1"]


def test_order_within_a_batch_is_kept(index: Lexical) -> None:
    a, b = turn(1, "ordered alpha"), turn(2, "ordered bravo")
    load(
        index,
        [
            a,
            Deletion(seq=3, tenant=TENANT, memory_id=a.memory_id),  # written then deleted
            Deletion(seq=4, tenant=TENANT, memory_id=b.memory_id),
            b,  # deleted then written
        ],
    )
    assert ids(index.search(SCOPE, "ordered", 10)) == [b.memory_id]


def test_concurrent_applies(index: Lexical) -> None:
    def worker(base: int) -> None:
        for i in range(20):
            index.apply([turn(base + i, "concurrent write")])

    threads = [threading.Thread(target=worker, args=(1000 * (k + 1),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    index.commit()
    assert len(index.search(SCOPE, "concurrent", 1000)) == 80
    assert index.applied_seq() == 4019


# -- durability and lifecycle --------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_applied_seq_survives_close_and_reopen(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "lexical"
    ix = open_lexical(kind, path)
    assert ix.applied_seq() == 0
    load(ix, [turn(7, "persisted words"), turn(9, "more words")])
    assert ix.applied_seq() == 9
    ix.apply([Deletion(seq=12, tenant=TENANT, memory_id="unknown")])  # pending at close
    ix.close()
    ix.close()  # idempotent

    ix = open_lexical(kind, path)
    try:
        assert ix.applied_seq() == 12  # close committed the pending change
        assert len(ix.search(SCOPE, "words", 10)) == 2
        load(ix, [turn(15, "later words")])
        assert ix.applied_seq() == 15
    finally:
        ix.close()
    ix = open_lexical(kind, path)
    try:
        assert ix.applied_seq() == 15
        assert len(ix.search(SCOPE, "words", 10)) == 3
    finally:
        ix.close()


def test_applied_seq_never_goes_back(index: Lexical) -> None:
    load(index, [turn(10, "x words")])
    load(index, [turn(3, "replayed words")])
    assert index.applied_seq() == 10


@pytest.mark.parametrize(
    ("kind", "error"), [("tantivy", IndexLockedError), ("qdrant-edge", ShardLockedError)]
)
def test_one_writer_per_directory(kind: str, error: type[Exception], tmp_path: Path) -> None:
    path = tmp_path / "lexical"
    ix = open_lexical(kind, path)
    with pytest.raises(error):
        open_lexical(kind, path)
    ix.close()
    again = open_lexical(kind, path)
    try:
        assert again.applied_seq() == 0
    finally:
        again.close()


@pytest.mark.parametrize("kind", KINDS)
def test_closed_index_refuses_writes(kind: str, tmp_path: Path) -> None:
    ix = open_lexical(kind, tmp_path / "lexical")
    ix.close()
    with pytest.raises(RuntimeError):
        ix.apply([turn(1, "late")])
    with pytest.raises(RuntimeError):
        ix.commit()


def test_metadata_filters_are_exact_terms_and_leave_the_score(index: Lexical) -> None:
    chef, maya = metadata_term("agent_id", "chef"), metadata_term("speaker", "Maya")
    a = replace(turn(1, "deploy the app"), filter_terms=(chef, maya))
    b = replace(turn(2, "deploy again"), filter_terms=(chef,))
    c = turn(3, "deploy tomorrow")
    index.apply([a, b, c])
    index.commit()

    def found(*pairs: tuple[str, str]) -> dict[str, float]:
        scope = Scope(tenant=TENANT, user=USER, metadata=tuple(sorted(pairs)))
        return {h.memory_id: h.score for h in index.search(scope, "deploy", 10)}

    everything = found()
    assert set(everything) == {a.memory_id, b.memory_id, c.memory_id}
    chef = found(("agent_id", "chef"))
    assert set(chef) == {a.memory_id, b.memory_id}
    assert all(score == pytest.approx(everything[m]) for m, score in chef.items())
    assert set(found(("agent_id", "chef"), ("speaker", "Maya"))) == {a.memory_id}
    assert found(("agent_id", "Chef")) == {}
    # The applied_seq document is in the same field: nothing can match it.
    assert found(("applied", "seq")) == {} and index.applied_seq() == 3


# -- typo repair ---------------------------------------------------------------------------

TYPO_TURNS = [
    "I went to the support group for the first time yesterday",
    "Caroline researched adoption agencies all week",
    "we went camping by the lake with the kids",
    "the pottery class was relaxing",
]


@pytest.mark.parametrize("kind", KINDS)
def test_typo_repair_finds_the_word_a_slip_away(kind: str, tmp_path: Path) -> None:
    plain = open_lexical(kind, tmp_path / "a")
    repairing = open_lexical(kind, tmp_path / "b", typos=True)
    try:
        for ix in (plain, repairing):
            load(ix, [turn(i + 1, t) for i, t in enumerate(TYPO_TURNS)])
        first = turn(1, TYPO_TURNS[0]).memory_id
        second = turn(2, TYPO_TURNS[1]).memory_id
        # A dropped letter, a swapped pair, a neighbouring key: no document holds them.
        assert plain.search(SCOPE, "reserch adopton", 10) == []
        assert ids(repairing.search(SCOPE, "reserch adopton", 10)) == [second]
        assert ids(repairing.search(SCOPE, "suport gorup", 10))[:1] == [first]
        # A word typed right is searched as typed: the repair never adds other words.
        assert ids(repairing.search(SCOPE, "camping", 10)) == ids(
            plain.search(SCOPE, "camping", 10)
        )
        # Words under 4 letters are not guessed at (too many neighbours: "lak" is one
        # letter from "lake"), nor is a word two slips away.
        assert repairing.search(SCOPE, "lak", 10) == []
        assert ids(repairing.search(SCOPE, "lakz", 10)) == [turn(3, TYPO_TURNS[2]).memory_id]
        assert repairing.search(SCOPE, "potteeyr", 10) == []
        # The repaired terms are weighted below the word typed right.
        both = repairing.search(SCOPE, "pottery reserch", 10)
        assert ids(both)[0] == turn(4, TYPO_TURNS[3]).memory_id
    finally:
        plain.close()
        repairing.close()


REPAIR_TURNS = [
    "yoga is how I destress after work",
    "the distress call came at night",
    "we went to the pride festival together",
    "dinner with my mother",
]


@pytest.mark.parametrize("typos", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_a_callers_repair_is_searched_only_for_a_word_no_turn_holds(
    kind: str, typos: bool, tmp_path: Path
) -> None:
    """`query_repairs` (the gateway's query speller): a word the user's turns hold is
    searched as typed, whatever a word list thought of it; one they do not hold is
    searched as the caller's repair, at full weight, with or without typo repair."""
    ix = open_lexical(kind, tmp_path / "lexical", typos=typos)
    try:
        turns = [turn(i + 1, t) for i, t in enumerate(REPAIR_TURNS)]
        load(ix, turns)
        destress, distress, festival, dinner = (t.memory_id for t in turns)
        assert ids(ix.search(SCOPE, "destress", 10, {"destress": "distress"})) == [destress]
        assert ids(ix.search(SCOPE, "fesetival", 10, {"fesetival": "festival"})) == [festival]
        assert ix.search(SCOPE, "fesetival", 10, {"fesetival": "festival"})[0].score == (
            pytest.approx(ix.search(SCOPE, "festival", 10)[0].score)
        )
        # A repair that is also typed counts once, as the word typed twice would.
        twice = ix.search(SCOPE, "festival fesetival", 10, {"fesetival": "festival"})
        assert twice[0].score == pytest.approx(ix.search(SCOPE, "festival", 10)[0].score)
        # Repaired to a stop word ("iwth" -> "with"): dropped, as the query's own stop
        # words are; typo repair alone would have searched "with".
        assert ix.search(SCOPE, "iwth", 10, {"iwth": "with"}) == []
        assert ids(ix.search(SCOPE, "iwth", 10)) == ([dinner] if typos else [])
        # A repair no turn holds either: the typed word, with its own typo repair.
        assert ids(ix.search(SCOPE, "fesetival", 10, {"fesetival": "fettival"})) == (
            [festival] if typos else []
        )
        # A repair of a word the query does not hold changes nothing.
        assert ids(ix.search(SCOPE, "distress", 10, {"reserch": "research"})) == [distress]
    finally:
        ix.close()


@pytest.mark.parametrize("kind", ["qdrant-edge", "qdrant-local"])
def test_sparse_typo_repair_reads_only_the_users_own_turns(kind: str, tmp_path: Path) -> None:
    """The sparse index asks its own scope whether a word is known: a word only another
    user's turns hold is still repaired for this user, and another user's words are
    never what a repair turns into."""
    ix = open_lexical(kind, tmp_path / "lexical", typos=True)
    try:
        mine = turn(1, "we went to the research lab")
        load(ix, [mine, turn(2, "reserch is how bob spells it", user="bob")])
        load(ix, [turn(3, "my adoption papers", user="bob")])
        assert ids(ix.search(SCOPE, "reserch", 10)) == [mine.memory_id]
        assert ix.search(SCOPE, "adopton", 10) == []  # only bob holds "adopt"
    finally:
        ix.close()
