"""The extractive merge (no LLM): the facts of the dropped turns kept as dated, attributed
lines, nothing repeated, the newest kept when over budget, never over `summary_tokens`,
deterministic; merge_mode=auto picks it for the built-in base model; the merge worker
with merge_mode=extractive never calls the LLM."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from summariser_fakes import ScriptedLlm, WordCounter

from hippo_core.listen import reserve_port
from hippo_summariser.__main__ import merge_config
from hippo_summariser.adapters import tgi_info
from hippo_summariser.adapters.sqlite_store import SqliteSessionStore
from hippo_summariser.domain import extractive, facts
from hippo_summariser.domain.merge import MergeConfig, Merger
from hippo_summariser.domain.models import Role, SessionKey, TurnIn, WindowTurn
from hippo_summariser.domain.ports import LlmUnavailable
from hippo_summariser.domain.service import Budgets, SummariserService
from hippo_summariser.domain.summarise import SummaryConfig
from hippo_summariser.settings import SummariserSettings

MAY_8 = 1_683_504_000_000_000  # 2023-05-08 00:00 UTC
DAY = 86_400_000_000


def turn(seq: int, text: str, speaker: str = "Ana", time_us: int = MAY_8) -> WindowTurn:
    role = Role.USER if speaker == "Ana" else Role.ASSISTANT
    return WindowTurn(seq, f"m{seq}", role, text, time_us, speaker, len(text.split()))


CHAT = [
    turn(1, "Wow, I ran the Porto half marathon in 1:58 on Sunday!"),
    turn(2, "Congrats! That's amazing.", "Bot"),
    turn(3, "My sister Joana paid $240 for our hotel, booking KX-4471."),
    turn(4, "Did Joana run too?", "Bot"),
    turn(5, "No, she is training for the Lisbon 10k in June with 3 friends."),
]


async def merge(summary: str, turns: list[WindowTurn], cap: int = 400) -> str:
    return (await extractive.merge(summary, turns, WordCounter(), cap)).summary


async def test_every_fact_of_the_dropped_turns_is_kept_when_the_budget_allows() -> None:
    outcome = await extractive.merge("", CHAT, WordCounter(), 400)
    required = facts.extract_all((t.text, t.speaker) for t in CHAT)
    assert required and facts.missing(required, outcome.summary) == []
    assert outcome.kept == outcome.facts == len(required) and outcome.retention == 1.0
    assert outcome.llm_calls == 0 and not outcome.repaired
    # One dated, attributed line per turn that says something; fillers are gone.
    assert outcome.summary.startswith("8 May 2023, Ana: ran the Porto half marathon in 1:58")
    assert "Congrats" not in outcome.summary and "amazing" not in outcome.summary
    assert "Wow" not in outcome.summary


async def test_lines_are_read_back_as_the_old_summary_and_not_repeated() -> None:
    first = await merge("", CHAT)
    again = await merge(first, [turn(6, "I ran the Porto half marathon in 1:58!")])
    assert again == first  # a restatement of what the summary holds adds nothing
    later = [turn(7, "Joana paid $240 for the hotel, KX-4471.", time_us=MAY_8 + DAY)]
    assert await merge(first, later) == first  # its facts are all held already


async def test_a_fact_new_to_the_summary_is_added_once() -> None:
    first = await merge("", CHAT)
    more = [
        turn(6, "Joana finished the Lisbon 10k in 52 minutes.", time_us=MAY_8 + DAY),
        turn(7, "Joana finished the Lisbon 10k in 52 minutes!", "Bot", MAY_8 + DAY),
    ]
    merged = await merge(first, more)
    assert merged.startswith(first)
    assert merged.count("52 minutes") == 1
    assert merged.endswith("9 May 2023, Ana: Joana finished the Lisbon 10k in 52 minutes.")


async def test_near_duplicates_within_the_turns_are_kept_once() -> None:
    turns = [
        turn(1, "We adopted a puppy called Biscuit from the shelter in Leeds."),
        turn(2, "You adopted a puppy called Biscuit from the shelter in Leeds?", "Bot"),
        turn(3, "Yes, a puppy called Biscuit from the Leeds shelter."),
    ]
    merged = await merge("", turns)
    assert merged.count("Biscuit") == 1 and "Leeds" in merged


async def test_over_budget_the_oldest_go_first_and_the_newest_facts_stay() -> None:
    turns = [
        turn(i, f"Order number {1000 + i} shipped to Porto on day {i}.", time_us=MAY_8 + i * DAY)
        for i in range(1, 21)
    ]
    outcome = await extractive.merge("", turns, WordCounter(), 40)
    assert outcome.summary_tokens <= 40
    kept = [i for i in range(1, 21) if f"{1000 + i}" in outcome.summary]
    assert kept and kept == list(range(21 - len(kept), 21))  # a suffix: the newest
    # Every fact was extracted; fitting the budget is what lost the oldest.
    assert outcome.kept_llm == outcome.facts and 0 < outcome.kept < outcome.facts


async def test_lines_without_facts_go_before_older_lines_with_facts() -> None:
    old = "7 May 2023, Ana: paid $50 for the Porto tickets."
    turns = [turn(1, "I have been feeling wonderfully relaxed after yoga and long walks lately.")]
    merged = await merge(old, turns, cap=len(old.split()))
    assert merged == old


async def test_a_sentence_that_only_addresses_someone_is_not_kept() -> None:
    turns = [
        turn(1, "Thanks for the tip, Melanie! I booked the Porto trip for 12 June."),
        turn(2, "Glad you liked it, Ana.", "Melanie"),
    ]
    merged = await merge("", turns)
    # Whom Ana spoke to stays (a name is a fact), in two tokens, not a sentence.
    assert merged == "8 May 2023, Ana (to Melanie): booked the Porto trip for 12 June."


async def test_within_a_line_the_sentences_without_facts_go_first() -> None:
    text = (
        "We finally painted the whole garden fence bright green last weekend. "
        "Joana paid $240 for the paint."
    )
    merged = await merge("", [turn(1, text)], cap=12)
    assert merged == "8 May 2023, Ana: Joana paid $240 for the paint."


async def test_over_budget_a_fact_sentence_is_cut_to_its_facts_before_it_goes() -> None:
    text = "Joana paid $240 for the paint, which was a bright and cheerful green we loved."
    assert await merge("", [turn(1, text)], cap=10) == (
        "8 May 2023, Ana: Joana paid $240 for the paint."
    )
    assert text.rstrip(".") in await merge("", [turn(1, text)], cap=40)


async def test_a_line_longer_than_the_budget_leaves_the_newest_facts_listed() -> None:
    text = "blue " * 30 + "met Joana at 5 pm."
    outcome = await extractive.merge("", [turn(1, text)], WordCounter(), 8)
    assert outcome.summary.startswith(facts.REPAIR_PREFIX)
    assert 0 < outcome.summary_tokens <= 8


async def test_deterministic() -> None:
    runs = {await merge("1 May 2023, Bot: asked about the race.", CHAT) for _ in range(3)}
    assert len(runs) == 1


_WORDS = st.sampled_from(
    ["Ana", "Joana", "Porto", "ran", "paid", "$240", "KX-4471", "3", "June", "8 May 2023",
     "the", "hotel", "Wow,", "I", "10k", "friends", "yesterday", "at 5 pm", "and", "."]
)  # fmt: skip
_TEXT = st.lists(_WORDS, min_size=1, max_size=30).map(" ".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    summary=_TEXT,
    texts=st.lists(_TEXT, min_size=1, max_size=6),
    cap=st.integers(min_value=16, max_value=80),
)
def test_the_summary_never_exceeds_its_budget(summary: str, texts: list[str], cap: int) -> None:
    """Invariant: whatever the summary and the turns, the result is at most `cap` tokens
    (the counter's) and its reported size is the counter's count of it."""
    turns = [turn(i, t, "Ana" if i % 2 else "Bot") for i, t in enumerate(texts)]
    outcome = asyncio.run(extractive.merge(summary, turns, WordCounter(), cap))
    assert outcome.summary_tokens <= cap
    assert outcome.summary_tokens == len(outcome.summary.split())
    assert outcome.kept <= outcome.facts and outcome.llm_calls == 0


def test_auto_picks_extractive_for_the_built_in_base_model_only() -> None:
    assert extractive.auto_mode("google/gemma-3-270m (GGUF Q4_K_M, dequantised)") == "extractive"
    assert extractive.auto_mode("google/gemma-3-270m") == "extractive"
    assert extractive.auto_mode("google/gemma-3-270m-it") == "llm"
    assert extractive.auto_mode("meta-llama/Llama-3.1-8B-Instruct") == "llm"
    assert extractive.auto_mode("") == "llm"


KEY = SessionKey("acme", "u1", "s1")


def exchange(i: int) -> list[TurnIn]:
    return [
        TurnIn(f"q{i}", Role.USER, f"I booked table {i} at Nando's for {i + 2} people", i, "Ada"),
        TurnIn(f"a{i}", Role.ASSISTANT, f"Noted: table {i} code X{i} for {i + 2}", i, "Bot"),
    ]


async def run_merges(tmp_path: Path, mode: str, model: str = "") -> tuple[ScriptedLlm, str]:
    store = SqliteSessionStore(tmp_path / "sessions.sqlite3", owner="")
    counter = WordCounter()
    llm = ScriptedLlm("Ada booked a table.")

    async def model_id() -> str:
        return model

    config = MergeConfig(
        window_tokens=60,
        low_water_tokens=40,
        max_input_tokens=1000,
        summary=SummaryConfig(summary_tokens=400, mode=mode),
        backoff_initial_seconds=0.01,
        backoff_max_seconds=0.05,
        drain_seconds=0.1,
    )
    merger = Merger(store, counter, llm, config, jitter=lambda: 1.0, llm_model_id=model_id)
    svc = SummariserService(store, counter, merger, Budgets(60, 400, 30.0))
    try:
        for i in range(8):
            await svc.append(KEY, exchange(i))
        view = await svc.flush(KEY, 10)
        assert not view.merge_pending and view.session.stats.merges >= 1
        return llm, view.session.summary
    finally:
        await svc.close()


async def test_the_merge_worker_in_extractive_mode_never_calls_the_llm(tmp_path: Path) -> None:
    llm, summary = await run_merges(tmp_path, "extractive")
    assert llm.prompts == []
    assert "table 0" in summary and "X0" in summary


async def test_auto_merges_extractively_behind_the_built_in_model(tmp_path: Path) -> None:
    llm, _ = await run_merges(tmp_path, "auto", "google/gemma-3-270m (GGUF Q4_K_M, dequantised)")
    assert llm.prompts == []


async def test_auto_uses_the_llm_behind_another_model(tmp_path: Path) -> None:
    llm, _ = await run_merges(tmp_path, "auto", "Qwen/Qwen2.5-7B-Instruct")
    assert llm.prompts


def test_auto_behind_an_openai_compatible_api_means_llm() -> None:
    assert merge_config(SummariserSettings()).summary.mode == "auto"  # settled by /info
    assert merge_config(SummariserSettings(llm_backend="openai")).summary.mode == "llm"
    explicit = SummariserSettings(llm_backend="openai", merge_mode="extractive")
    assert merge_config(explicit).summary.mode == "extractive"


async def test_the_llm_model_id_comes_from_tgi_info() -> None:
    """auto's question to the LLM: /info's model_id; "" where the server has no /info;
    LlmUnavailable (the merge retried later) where nothing answers."""

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"model_id": "google/gemma-3-270m (GGUF Q4_K_M)"})

    app = web.Application()
    app.router.add_get("/info", info)
    runner = web.AppRunner(app)
    await runner.setup()
    port = reserve_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        url = f"http://127.0.0.1:{port}"
        assert await tgi_info.model_id(url + "/", 5) == "google/gemma-3-270m (GGUF Q4_K_M)"
        app_without = f"{url}/elsewhere"  # 404: not TGI's /info
        assert await tgi_info.model_id(app_without, 5) == ""
    finally:
        await runner.cleanup()
    with pytest.raises(LlmUnavailable):
        await tgi_info.model_id(f"http://127.0.0.1:{port}", 2)
