"""The public Memory API through the real gateway, embedding and retrieval processes."""

from __future__ import annotations

import uuid

import grpc
import pytest
from gateway_harness import Cluster, key_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo.memory.v1 import memory_pb2, memory_pb2_grpc

HYBRID, LEXICAL, SEMANTIC = (
    memory_pb2.RECALL_MODE_HYBRID,
    memory_pb2.RECALL_MODE_LEXICAL,
    memory_pb2.RECALL_MODE_SEMANTIC,
)
MODES = (HYBRID, LEXICAL, SEMANTIC)


def uid(prefix: str = "u") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def remember(
    stub: memory_pb2_grpc.MemoryServiceStub,
    tenant: str,
    user: str,
    texts: list[str],
    *,
    session: str = "s1",
    client_ids: list[str] | None = None,
    key: str = "",
) -> memory_pb2.RememberResponse:
    turns = [
        memory_pb2.Turn(
            role=memory_pb2.ROLE_USER if i % 2 == 0 else memory_pb2.ROLE_ASSISTANT,
            text=text,
            client_id=client_ids[i] if client_ids else "",
        )
        for i, text in enumerate(texts)
    ]
    request = memory_pb2.RememberRequest(
        scope=memory_pb2.Scope(user_id=user, session_id=session),
        turns=turns,
        idempotency_key=key,
        wait_searchable=True,
    )
    reply: memory_pb2.RememberResponse = stub.Remember(request, metadata=key_of(tenant), timeout=10)
    return reply


def recall(
    stub: memory_pb2_grpc.MemoryServiceStub,
    tenant: str,
    user: str,
    query: str,
    mode: int = HYBRID,
    top_k: int = 10,
) -> memory_pb2.RecallResponse:
    request = memory_pb2.RecallRequest(
        scope=memory_pb2.Scope(user_id=user), query=query, mode=mode, top_k=top_k
    )
    reply: memory_pb2.RecallResponse = stub.Recall(request, metadata=key_of(tenant), timeout=10)
    return reply


def texts_of(reply: memory_pb2.RecallResponse) -> list[str]:
    return [h.memory.text for h in reply.hits]


DISTRACTORS = [
    "The submit button handler in the checkout form is slow to respond.",
    "Form submission handling needs a rewrite before the release.",
    "We moved the form validation into its own function last sprint.",
    "The event handler for the login form fires twice on click.",
    "I had pasta for lunch and then went for a walk in the park.",
    "My sister is visiting next month with her two kids.",
    "The quarterly budget review is scheduled for Thursday afternoon.",
    "Our cat knocked the plant off the windowsill again.",
]


def test_identifiers_by_bm25_paraphrases_by_vectors_both_first_under_rrf(stub) -> None:  # type: ignore[no-untyped-def]
    user = uid()
    # An identifier mentioned in passing in a long turn: its vector is about the trip.
    identifier = (
        "We spent the weekend planning the family trip to Portugal: flights from Boston, "
        "three nights in Lisbon, a rental car to the Algarve, a day at the aquarium. Oh, "
        "before I forget, the crash from Friday was in handleSubmit. Anyway, the beaches "
        "are supposed to be lovely in June and my mother wants to come along as well."
    )
    paraphrase = "Yesterday we adopted a golden retriever puppy called Max."
    both = "handleSubmit crashes whenever the signup form is submitted."
    remember(stub, "acme", user, [*DISTRACTORS, identifier, paraphrase, both])

    lexical = recall(stub, "acme", user, "handleSubmit", LEXICAL)
    semantic = recall(stub, "acme", user, "handleSubmit", SEMANTIC)
    # Only they hold the word (the paraphrase after them may follow: its BM25 document
    # quotes the turn before it).
    assert set(texts_of(lexical)[:2]) == {identifier, both}
    # Vectors rank a turn that lacks the word above it (beside the one that has it).
    assert texts_of(semantic).index(identifier) >= 2

    dog_lexical = recall(stub, "acme", user, "our new dog", LEXICAL)
    dog_semantic = recall(stub, "acme", user, "our new dog", SEMANTIC)
    assert paraphrase not in texts_of(dog_lexical)  # no shared word, nor in the turn before
    assert texts_of(dog_semantic)[0] == paraphrase

    hybrid = recall(stub, "acme", user, "handleSubmit crash on form submission", HYBRID)
    top = hybrid.hits[0]
    assert top.memory.text == both
    assert top.lexical_rank >= 1 and top.semantic_rank >= 1
    rrf = 1.5 / (5 + top.lexical_rank) + 1 / (5 + top.semantic_rank)  # the defaults
    assert top.fused_score >= rrf - 1e-12  # plus what its session neighbours lend it
    assert hybrid.lexical_candidates > 0 and hybrid.semantic_candidates > 0


def test_a_typing_slip_is_repaired_before_the_query_is_searched(stub) -> None:  # type: ignore[no-untyped-def]
    """The gateway's query speller (`words` by default): a query with slips is searched as
    the one without them, so every retriever scores every turn exactly alike."""
    user = uid()
    remember(stub, "acme", user, [*DISTRACTORS, "Our relationship has been great lately."])
    for mode in (SEMANTIC, HYBRID):
        typed = recall(stub, "acme", user, "how is the relatioonship going latley", mode)
        right = recall(stub, "acme", user, "how is the relationship going lately", mode)
        assert texts_of(typed)[0] == "Our relationship has been great lately."
        # The reply says what was repaired (the caller may show it: "did you mean").
        assert dict(typed.query_repairs) == {"relatioonship": "relationship", "latley": "lately"}
        assert dict(right.query_repairs) == {}
        assert [
            (h.memory.memory_id, h.semantic_score, h.lexical_score, h.fused_score)
            for h in typed.hits
        ] == [
            (h.memory.memory_id, h.semantic_score, h.lexical_score, h.fused_score)
            for h in right.hits
        ]


def test_a_word_the_users_turns_hold_is_searched_as_typed(stub) -> None:  # type: ignore[no-untyped-def]
    """The English list lacks "destress" and repairs it to "distress"; this user's turns
    hold it, so BM25 searches it as typed (`words`), not the list's guess."""
    user = uid()
    remember(
        stub,
        "acme",
        user,
        # (a turn's BM25 document quotes the turn before it: the later one holds both)
        [*DISTRACTORS, "The distress call came at night.", "Yoga is how I destress after work."],
    )
    assert texts_of(recall(stub, "acme", user, "how do I destress", LEXICAL)) == [
        "Yoga is how I destress after work."
    ]


def test_exact_identifiers_are_findable_by_their_exact_form(stub) -> None:  # type: ignore[no-untyped-def]
    user = uid()
    facts = {
        "handleSubmit": "The bug is in handleSubmit, it swallows the error.",
        "ERR_CONNECTION_REFUSED": "Chrome shows ERR_CONNECTION_REFUSED when the proxy is down.",
        "v2.14.1": "We pinned the client to v2.14.1 until the fix lands.",
        "src/app/main.py": "The entry point lives in src/app/main.py now.",
    }
    remember(
        stub, "acme", user, [*DISTRACTORS, *facts.values(), "v2.14.0 was yanked", "src/app/util.py"]
    )
    for query, text in facts.items():
        for mode in (LEXICAL, HYBRID):
            assert texts_of(recall(stub, "acme", user, query, mode))[0] == text, (query, mode)


@pytest.mark.parametrize(
    "query",
    [
        "handleSubmit(",
        "ERR_CONNECTION_REFUSED:",
        'he said "hi',
        "AND OR NOT",
        "*",
        "~",
        "🦛 ✨",
        "user_id:other",
    ],
)
def test_user_text_never_breaks_the_query_parser(stub, query: str) -> None:  # type: ignore[no-untyped-def]
    user = uid()
    remember(stub, "acme", user, ["handleSubmit failed with ERR_CONNECTION_REFUSED"])
    for mode in MODES:
        reply = recall(stub, "acme", user, query, mode)
        assert all(h.memory.scope.user_id == user for h in reply.hits)


def test_ten_kilobytes_of_query_text_search_as_plain_words(stub) -> None:  # type: ignore[no-untyped-def]
    user = uid()
    remember(stub, "acme", user, ["the quarterly report is late"])
    long_query = ("quarterly report " * 250)[:4096]  # the API's limit is 4 KiB
    assert (
        texts_of(recall(stub, "acme", user, long_query, HYBRID))[0]
        == "the quarterly report is late"
    )


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    placement=st.lists(
        st.tuples(
            st.sampled_from(["acme", "globex", "initech"]), st.integers(0, 2), st.integers(0, 5)
        ),
        min_size=4,
        max_size=14,
    )
)
def test_no_query_in_any_mode_crosses_tenant_or_user(stub, placement) -> None:  # type: ignore[no-untyped-def]
    """Duplicated texts across tenants and users: every hit of every query belongs to the
    asking tenant and user (ids are unique per example, so examples don't see each other)."""
    pool = [
        "my password hint is the name of my first dog",
        "the launch code is 0000 and must stay secret",
        "I am allergic to penicillin",
        "meet me at the old harbour at noon",
        "handleSubmit leaks the session token",
        "salary negotiation notes for Q3",
    ]
    run = uuid.uuid4().hex[:8]
    owners: dict[tuple[str, str], list[str]] = {}
    for tenant, user_n, text_n in placement:
        user = f"user{user_n}-{run}"
        owners.setdefault((tenant, user), []).append(pool[text_n])
    for (tenant, user), texts in owners.items():
        remember(stub, tenant, user, texts)
    for tenant in ("acme", "globex", "initech"):
        for user_n in range(3):
            user = f"user{user_n}-{run}"
            mine = set(owners.get((tenant, user), []))
            for mode in MODES:
                for query in pool[::2]:
                    reply = recall(stub, tenant, user, query, mode, top_k=100)
                    assert all(h.memory.scope.user_id == user for h in reply.hits)
                    assert set(texts_of(reply)) <= mine


def test_forget_removes_a_canary_from_every_mode_and_from_the_turn_store(
    stub,
    cluster: Cluster,  # type: ignore[no-untyped-def]
) -> None:
    user = uid()
    canary = f"canary-{uuid.uuid4().hex} the zebra sings at midnight"
    reply = remember(stub, "acme", user, ["an ordinary note", canary], session="s9")
    canary_id = reply.memory_ids[1]
    assert recall(stub, "acme", user, canary, HYBRID).hits[0].memory.memory_id == canary_id
    gone = stub.Forget(
        memory_pb2.ForgetRequest(
            memory_ids=memory_pb2.MemoryIds(
                scope=memory_pb2.Scope(user_id=user), memory_ids=[canary_id]
            )
        ),
        metadata=key_of("acme"),
        timeout=10,
    )
    assert gone.memories_deleted == 1
    # The embedding cache held the canary's vector (Remember and Recall embedded it):
    # it is dropped, so the canary no longer answers as "seen before" there.
    assert gone.cache_entries_dropped >= 1 and not gone.audit_key_destroyed
    with grpc.insecure_channel(cluster.embedding.addr) as channel:
        embed = embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed
        assert embed(embedding_pb2.EmbedRequest(texts=[canary]), timeout=10).cached == 0
    for mode in MODES:
        assert canary not in texts_of(recall(stub, "acme", user, canary, mode, top_k=100))
    token = canary.split()[0].encode()
    for path in cluster.retrieval_dir.glob("turns.sqlite3*"):
        assert token not in path.read_bytes(), path  # erased from the file, not just hidden
    again = stub.Forget(memory_pb2.ForgetRequest(user_id=user), metadata=key_of("acme"), timeout=10)
    assert again.memories_deleted == 1  # the ordinary note; the canary was already gone
    assert again.audit_key_destroyed  # a whole user: the audit service confirmed it
    assert recall(stub, "acme", user, "ordinary note", HYBRID).hits == []
    idempotent = stub.Forget(
        memory_pb2.ForgetRequest(user_id=user), metadata=key_of("acme"), timeout=10
    )
    assert idempotent.memories_deleted == 0


def test_forget_a_session_leaves_the_others(stub) -> None:  # type: ignore[no-untyped-def]
    user = uid()
    remember(stub, "acme", user, ["alpha note in one"], session="one")
    remember(stub, "acme", user, ["alpha note in two"], session="two")
    reply = stub.Forget(
        memory_pb2.ForgetRequest(session=memory_pb2.Scope(user_id=user, session_id="one")),
        metadata=key_of("acme"),
        timeout=10,
    )
    assert reply.memories_deleted == 1
    assert texts_of(recall(stub, "acme", user, "alpha note", LEXICAL)) == ["alpha note in two"]


def test_a_retried_remember_has_one_effect(stub) -> None:  # type: ignore[no-untyped-def]
    user = uid()
    first = remember(stub, "acme", user, ["one", "two"], client_ids=["D1:1", "D1:2"])
    retry = remember(stub, "acme", user, ["one", "two"], client_ids=["D1:1", "D1:2"])
    assert (first.created, first.deduplicated) == (2, 0)
    assert (retry.created, retry.deduplicated) == (0, 2)
    assert list(retry.memory_ids) == list(first.memory_ids)
    keyed = remember(stub, "acme", user, ["three", "four"], key="req-7")
    keyed_retry = remember(stub, "acme", user, ["three", "four"], key="req-7")
    assert list(keyed.memory_ids) == list(keyed_retry.memory_ids) and keyed_retry.created == 0
    unkeyed = remember(stub, "acme", user, ["five"])
    unkeyed_again = remember(stub, "acme", user, ["five"])
    assert unkeyed.memory_ids != unkeyed_again.memory_ids  # documented: no key, no dedup
    hits = recall(stub, "acme", user, "one two three four", LEXICAL, top_k=100).hits
    found = [h.memory.text for h in hits]
    assert all(found.count(word) == 1 for word in ("one", "two", "three", "four"))
    sequence = {h.memory.text: h.memory.sequence for h in hits}
    assert [sequence[w] for w in ("one", "two", "three", "four")] == [1, 2, 3, 4]
    other_tenant = remember(stub, "globex", user, ["one"], client_ids=["D1:1"])
    assert other_tenant.created == 1 and other_tenant.memory_ids[0] != first.memory_ids[0]


def test_the_largest_remember_the_api_allows_goes_through(stub) -> None:  # type: ignore[no-untyped-def]
    """64 turns of 32 KiB (2 MiB): over gRPC's 1 MiB default, inside every hop's limit."""
    user = uid()
    texts = [f"big{i} " + "x" * (32 * 1024 - 10) for i in range(64)]
    reply = remember(stub, "acme", user, texts)
    assert reply.created == 64
    hits = recall(stub, "acme", user, "big63", LEXICAL).hits
    assert [len(h.memory.text.encode()) for h in hits] == [len(texts[63])]


def test_missing_or_wrong_api_key_is_unauthenticated(stub) -> None:  # type: ignore[no-untyped-def]
    request = memory_pb2.RecallRequest(scope=memory_pb2.Scope(user_id="u"), query="q")
    for metadata in (
        (),
        (("x-api-key", "nope"),),
        (("authorization", "Basic abc"),),
        (("authorization", "Bearer "),),
    ):
        with pytest.raises(grpc.RpcError) as err:
            stub.Recall(request, metadata=metadata, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
    ok = stub.Recall(request, metadata=(("authorization", "Bearer key-acme"),), timeout=5)
    assert ok.hits == [] or ok.hits[0].memory.scope.user_id == "u"


def _invalid(stub, call: str, request, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        getattr(stub, call)(request, metadata=key_of("acme"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert err.value.details().startswith(field), err.value.details()


def test_limits_give_invalid_argument_naming_the_field(stub) -> None:  # type: ignore[no-untyped-def]
    scope = memory_pb2.Scope(user_id="u1", session_id="s1")

    def rem(*turns: memory_pb2.Turn, **kw) -> memory_pb2.RememberRequest:  # type: ignore[no-untyped-def]
        return memory_pb2.RememberRequest(scope=kw.pop("scope", scope), turns=list(turns), **kw)

    turn = memory_pb2.Turn(role=memory_pb2.ROLE_USER, text="hi")
    _invalid(stub, "Remember", rem(*[turn] * 65), "turns: must hold 1..64")
    _invalid(stub, "Remember", rem(), "turns: must hold 1..64")
    _invalid(
        stub,
        "Remember",
        rem(memory_pb2.Turn(role=memory_pb2.ROLE_USER, text="x" * 32769)),
        "turns[0].text: 32769 bytes exceeds the limit of 32768",
    )
    _invalid(stub, "Remember", rem(memory_pb2.Turn(text="hi")), "turns[0].role")
    _invalid(
        stub,
        "Remember",
        rem(turn, scope=memory_pb2.Scope(user_id="u 1", session_id="s")),
        "scope.user_id",
    )
    _invalid(
        stub,
        "Remember",
        rem(turn, scope=memory_pb2.Scope(user_id="u1")),
        "scope.session_id: is required",
    )
    dup = memory_pb2.Turn(role=memory_pb2.ROLE_USER, text="a", client_id="c1")
    _invalid(stub, "Remember", rem(dup, dup), "turns[1].client_id")
    meta = memory_pb2.Turn(role=memory_pb2.ROLE_USER, text="a", metadata={"k": "v" * 1025})
    _invalid(
        stub, "Remember", rem(meta), "turns[0].metadata[k]: 1025 bytes exceeds the limit of 1024"
    )
    many = memory_pb2.Turn(
        role=memory_pb2.ROLE_USER, text="a", metadata={f"k{i}": "v" for i in range(33)}
    )
    _invalid(stub, "Remember", rem(many), "turns[0].metadata: at most 32")

    recall_scope = memory_pb2.Scope(user_id="u1")
    _invalid(
        stub, "Recall", memory_pb2.RecallRequest(scope=recall_scope, query="q", top_k=101), "top_k"
    )
    _invalid(
        stub,
        "Recall",
        memory_pb2.RecallRequest(scope=recall_scope, query="   "),
        "query: is required",
    )
    _invalid(
        stub,
        "Recall",
        memory_pb2.RecallRequest(scope=recall_scope, query="q" * 4097),
        "query: 4097 bytes exceeds the limit of 4096",
    )
    _invalid(stub, "Recall", memory_pb2.RecallRequest(query="q"), "scope.user_id: is required")
    backwards = memory_pb2.TimeRange()
    backwards.start.FromSeconds(200)
    backwards.end.FromSeconds(100)
    _invalid(
        stub,
        "Recall",
        memory_pb2.RecallRequest(scope=recall_scope, query="q", time_range=backwards),
        "time_range",
    )
    _invalid(
        stub,
        "Recall",
        memory_pb2.RecallRequest(scope=recall_scope, query="q", roles=[0]),
        "roles[0]",
    )
    _invalid(stub, "Forget", memory_pb2.ForgetRequest(), "target")
    _invalid(
        stub,
        "Forget",
        memory_pb2.ForgetRequest(memory_ids=memory_pb2.MemoryIds(scope=recall_scope)),
        "memory_ids.memory_ids",
    )


def test_time_range_and_role_filters(stub) -> None:  # type: ignore[no-untyped-def]
    user = uid()
    turns = []
    for i, (role, year) in enumerate(
        [
            (memory_pb2.ROLE_USER, 2021),
            (memory_pb2.ROLE_ASSISTANT, 2022),
            (memory_pb2.ROLE_USER, 2023),
        ]
    ):
        t = memory_pb2.Turn(role=role, text=f"garden note {i}")
        t.time.FromSeconds(int((year - 1970) * 365.25 * 86400))
        turns.append(t)
    stub.Remember(
        memory_pb2.RememberRequest(
            scope=memory_pb2.Scope(user_id=user, session_id="g"), turns=turns
        ),
        metadata=key_of("acme"),
        timeout=10,
    )
    window = memory_pb2.TimeRange()
    window.start.FromSeconds(int((2022 - 1970) * 365.25 * 86400) - 86400)
    reply = stub.Recall(
        memory_pb2.RecallRequest(
            scope=memory_pb2.Scope(user_id=user), query="garden note", time_range=window
        ),
        metadata=key_of("acme"),
        timeout=10,
    )
    assert sorted(texts_of(reply)) == ["garden note 1", "garden note 2"]
    users_only = stub.Recall(
        memory_pb2.RecallRequest(
            scope=memory_pb2.Scope(user_id=user), query="garden note", roles=[memory_pb2.ROLE_USER]
        ),
        metadata=key_of("acme"),
        timeout=10,
    )
    assert sorted(texts_of(users_only)) == ["garden note 0", "garden note 2"]


def test_a_tiny_deadline_is_deadline_exceeded_not_internal(stub) -> None:  # type: ignore[no-untyped-def]
    request = memory_pb2.RecallRequest(
        scope=memory_pb2.Scope(user_id="u1"), query="anything at all"
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.Recall(request, metadata=key_of("acme"), timeout=0.001)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_session_without_bounded_state_reads_empty(stub) -> None:  # type: ignore[no-untyped-def]
    """This cluster runs without a summariser: GetSession answers an empty state,
    version 0, as the API documents for a session with no state."""
    reply = stub.GetSession(
        memory_pb2.GetSessionRequest(scope=memory_pb2.Scope(user_id="u1", session_id="s1")),
        metadata=key_of("acme"),
        timeout=5,
    )
    assert (list(reply.window), reply.summary, reply.version) == ([], "", 0)
