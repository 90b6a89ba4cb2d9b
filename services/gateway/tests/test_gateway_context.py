"""BuildContext's assembly rules over doubles of its ports (the real tokenizer, summariser
and recall are exercised through the cluster in test_gateway_chat.py).

The tokenizer double counts words and adds a per-message overhead, like a chat format:
the rules under test (exact budget, priorities, placement) do not depend on how a real
tokenizer splits words.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hippo_core.errors import InvalidArgument
from hippo_gateway.domain.context import (
    MEMORY_HEADER,
    SUMMARY_HEADER,
    ContextBuilder,
    ContextConfig,
    alternate,
    exchanges,
)
from hippo_gateway.domain.models import (
    ChatMessage,
    ChatRole,
    Counted,
    Hit,
    Layout,
    Memory,
    Recalled,
    RecallQuery,
    Role,
    SessionState,
    SessionTurn,
    ZoneKind,
)

PER_MESSAGE = 4  # the double's "format" tokens per message


class WordTokenizer:
    async def count(self, messages: Sequence[ChatMessage]) -> Counted:
        text = "\n".join(f"<{m.role.value}> {m.text}" for m in messages)
        tokens = 1 + sum(len(m.text.split()) + PER_MESSAGE for m in messages)
        return Counted(tokens, text, 8192)

    async def count_text(self, text: str) -> int:
        return len(text.split())

    async def special_tokens(self) -> tuple[str, ...]:
        return ("<start_of_turn>", "<end_of_turn>")


class FakeRecall:
    def __init__(self, hits: list[Hit]) -> None:
        self.hits = hits
        self.queries: list[RecallQuery] = []

    async def recall(self, tenant: str, query: RecallQuery, *, audited: bool = True) -> Recalled:
        self.queries.append(query)
        return Recalled(self.hits[: query.top_k], len(self.hits), len(self.hits))


class FakeSessions:
    def __init__(self, state: SessionState) -> None:
        self.state = state

    async def append(self, *args: object) -> None:
        return None

    async def get(self, tenant: str, user: str, session: str) -> SessionState:
        return self.state

    async def forget(self, *args: object) -> int:
        return 0


def hit(i: int, words: int = 5, time_us: int = 0) -> Hit:
    memory = Memory(
        f"m{i}", "u", "old", Role.USER, " ".join([f"mem{i}"] * words), time_us or 10**15 + i,
        "", {"speaker": "Ada"}, i,
    )  # fmt: skip
    return Hit(memory, 1.0 / (i + 1), i + 1, i + 1, 1.0, 0.5)


def turn(i: int, role: Role, words: int = 3) -> SessionTurn:
    return SessionTurn(f"w{i}", role, " ".join([f"win{i}"] * words), 10**15 + i)


def window(pairs: int, words: int = 3) -> list[SessionTurn]:
    out = []
    for i in range(pairs):
        out += [turn(2 * i, Role.USER, words), turn(2 * i + 1, Role.ASSISTANT, words)]
    return out


def builder(hits: list[Hit], state: SessionState) -> ContextBuilder:
    return ContextBuilder(
        FakeRecall(hits),  # type: ignore[arg-type]
        FakeSessions(state),
        WordTokenizer(),
        ContextConfig(instructions="be helpful and brief", default_budget=2048),
    )


async def test_boundary_weighted_puts_memories_first_and_the_query_last() -> None:
    state = SessionState(window(2), "they talked about trains", 3)
    ctx = await builder([hit(0), hit(1)], state).build("t", "u", "s", "what next?", budget=300)
    assert [z.kind for z in ctx.zones] == [
        ZoneKind.SYSTEM, ZoneKind.MEMORIES, ZoneKind.SUMMARY, ZoneKind.WINDOW, ZoneKind.QUERY,
    ]  # fmt: skip
    system, *rest = ctx.messages
    assert system.role == ChatRole.SYSTEM and MEMORY_HEADER in system.text
    assert system.text.index("mem0") < system.text.index("mem1")  # best first
    assert '<memory date="' in system.text and 'speaker="Ada"' in system.text
    assert rest[0].text.startswith(SUMMARY_HEADER)  # recency zone opens with the summary
    assert rest[-1] == ChatMessage(ChatRole.USER, "what next?")
    assert ctx.total_tokens <= 300 and [h.memory.memory_id for h in ctx.memories_used] == [
        "m0",
        "m1",
    ]


async def test_summary_in_system_and_chronological_layouts() -> None:
    state = SessionState(window(1), "they talked about trains", 3)
    hits = [hit(0, time_us=10**15 + 50), hit(1, time_us=10**15 + 5)]
    in_system = await builder(hits, state).build(
        "t", "u", "s", "q", budget=300, layout=Layout.SUMMARY_IN_SYSTEM
    )
    system = in_system.messages[0].text
    assert system.index(SUMMARY_HEADER) < system.index(MEMORY_HEADER)
    assert [z.kind for z in in_system.zones][:3] == [
        ZoneKind.SYSTEM,
        ZoneKind.SUMMARY,
        ZoneKind.MEMORIES,
    ]
    chrono = await builder(hits, state).build(
        "t", "u", "s", "q", budget=300, layout=Layout.CHRONOLOGICAL
    )
    assert [h.memory.memory_id for h in chrono.memories_used] == ["m1", "m0"]  # oldest first
    assert chrono.messages[0].text.index("mem1") < chrono.messages[0].text.index("mem0")


async def test_memories_already_in_the_window_are_not_repeated() -> None:
    state = SessionState(window(1), "", 1)
    in_window = hit(9)
    in_window = Hit(
        Memory("w0", "u", "s", Role.USER, "win0 win0 win0", 1, "", {}, 1), 1.0, 1, 1, 1.0, 1.0
    )
    ctx = await builder([in_window, hit(1)], state).build("t", "u", "s", "q", budget=300)
    assert [h.memory.memory_id for h in ctx.memories_used] == ["m1"]
    assert [(s.memory_id, s.reason) for s in ctx.skipped] == [("w0", "in_window")]


async def test_hits_in_the_window_do_not_crowd_out_top_k_memories() -> None:
    """The best hits are the window's own turns (a long session); top_k memories from
    outside it still fill the memories zone, in rank order."""
    state = SessionState(window(6), "", 1)
    in_window = [
        Hit(Memory(t.memory_id, "u", "s", t.role, t.text, 1, "", {}, 1), 1.0, 1, 1, 1.0, 1.0)
        for t in state.window
    ]
    older = [hit(i) for i in range(8)]
    fake = FakeRecall([*in_window, *older])
    ctx = await ContextBuilder(
        fake,  # type: ignore[arg-type]
        FakeSessions(state),
        WordTokenizer(),
        ContextConfig(instructions="be helpful and brief", default_budget=2048),
    ).build("t", "u", "s", "q", budget=2000, top_k=5)
    assert [h.memory.memory_id for h in ctx.memories_used] == ["m0", "m1", "m2", "m3", "m4"]
    assert [s.reason for s in ctx.skipped] == ["in_window"] * 12
    assert fake.queries[0].top_k > 5 + 12  # asked for enough to skip a full window


async def test_when_tight_memories_go_before_window_exchanges() -> None:
    state = SessionState(window(3, words=30), "", 1)
    hits = [hit(i, words=30) for i in range(10)]
    roomy = await builder(hits, state).build("t", "u", "s", "q", budget=2000)
    assert len(roomy.memories_used) == 10 and len(roomy.window_ids) == 6
    # Room for the window and two memories, not for all ten.
    tight_budget = roomy.total_tokens - 8 * 34
    tight = await builder(hits, state).build("t", "u", "s", "q", budget=tight_budget)
    assert len(tight.window_ids) == 6  # the whole window stays
    assert [h.memory.memory_id for h in tight.memories_used] == ["m0", "m1"]
    assert {s.memory_id for s in tight.skipped if s.reason == "over_budget"} == {
        f"m{i}" for i in range(2, 10)
    }
    assert tight.total_tokens <= tight_budget
    # Tighter still: the oldest exchanges go; the latest stays.
    long_window = SessionState(window(4, words=40), "", 1)
    tighter = await builder(hits, long_window).build("t", "u", "s", "q", budget=256)
    assert tighter.window_ids == ["w4", "w5", "w6", "w7"] and tighter.total_tokens <= 256


async def test_a_budget_that_cannot_hold_the_essentials_is_refused_naming_it() -> None:
    state = SessionState(window(1, words=200), "", 1)
    with pytest.raises(
        InvalidArgument, match="token_budget: the instructions, the query and the latest exchange"
    ):
        await builder([], state).build("t", "u", "s", "q", budget=256)
    with pytest.raises(
        InvalidArgument, match=r"token_budget: must be 0 \(default\) or 256\.\.131072"
    ):
        await builder([], state).build("t", "u", "s", "q", budget=100)
    with pytest.raises(InvalidArgument, match="query: is required"):
        await builder([], state).build("t", "u", "s", "  ", budget=1000)


@settings(max_examples=120, deadline=None)
@given(
    pairs=st.integers(0, 8),
    turn_words=st.integers(1, 40),
    hits_n=st.integers(0, 10),
    hit_words=st.integers(1, 60),
    summary_words=st.integers(0, 80),
    budget=st.integers(256, 900),
    layout=st.sampled_from(list(Layout)),
)
async def test_the_budget_is_never_exceeded_and_drops_go_lowest_priority_first(
    pairs: int,
    turn_words: int,
    hits_n: int,
    hit_words: int,
    summary_words: int,
    budget: int,
    layout: Layout,
) -> None:
    summary = " ".join(["sum"] * summary_words)
    state = SessionState(window(pairs, turn_words), summary, 1)
    hits = [hit(i, hit_words) for i in range(hits_n)]
    try:
        ctx = await builder(hits, state).build(
            "t", "u", "s", "the query", budget=budget, layout=layout
        )
    except InvalidArgument as exc:
        # Only when the must-haves alone are too big.
        assert exc.field == "token_budget"
        must = await WordTokenizer().count(
            alternate(
                [ChatMessage(ChatRole.SYSTEM, "be helpful and brief")]
                + [
                    ChatMessage(
                        ChatRole.USER if t.role == Role.USER else ChatRole.ASSISTANT, t.text
                    )
                    for t in window(pairs, turn_words)[-2:]
                ]
                + [ChatMessage(ChatRole.USER, "the query")]
            )
        )
        assert must.tokens > budget
        return
    assert ctx.total_tokens <= budget
    last = ctx.messages[-1]  # the query ends the prompt (a summary may share its message)
    assert last.role == ChatRole.USER and last.text.endswith("the query")
    roles = [m.role for m in ctx.messages[1:]]
    assert all(a != b for a, b in itertools.pairwise(roles))  # alternation
    assert roles[0] == ChatRole.USER
    groups = exchanges(state.window)
    kept = set(ctx.window_ids)
    if groups:
        assert {t.memory_id for t in groups[-1]} <= kept  # the latest exchange always
    # The window kept is a contiguous recent tail of whole exchanges.
    tail = [t.memory_id for g in groups for t in g][
        len([t for g in groups for t in g]) - len(kept) :
    ]
    assert set(tail) == kept
    used = [h.memory.memory_id for h in ctx.memories_used]
    ranked = [h.memory.memory_id for h in hits]
    if layout != Layout.CHRONOLOGICAL:
        assert used == ranked[: len(used)]  # best first, and only a prefix of the ranking
    else:
        assert set(used) == set(ranked[: len(used)])
