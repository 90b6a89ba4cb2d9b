"""The use cases over the real store (both engines), with a scripted LLM: merges off the request
path and in order, the LLM or the counter down, Forget racing a merge, concurrent writers,
shutdown mid-merge, resuming at start."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from summariser_fakes import ScriptedLlm, WordCounter
from summariser_harness import Stores
from tgi_double import echo, note

from hippo_core.errors import InvalidArgument, Unavailable
from hippo_summariser.domain.merge import MergeConfig, Merger
from hippo_summariser.domain.models import MergeEvent, Role, SessionKey, TurnIn
from hippo_summariser.domain.ports import Completion, LlmUnavailable
from hippo_summariser.domain.service import Budgets, SummariserService
from hippo_summariser.domain.summarise import SummaryConfig

KEY = SessionKey("acme", "u1", "s1")
WINDOW = 60  # WordCounter tokens: a turn "<start_of_turn>user\n{5 words}..." is ~7


def exchange(i: int) -> list[TurnIn]:
    return [
        TurnIn(f"q{i}", Role.USER, f"question {i} about item number {i}", i, "Ada"),
        TurnIn(f"a{i}", Role.ASSISTANT, f"answer {i} mentions code X{i}", i, "Bot"),
    ]


class Gate:
    """An LLM that waits for `open` before answering (a merge held in flight)."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.entered = asyncio.Event()
        self.prompts: list[str] = []

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        self.prompts.append(prompt)
        self.entered.set()
        await self.open.wait()
        return Completion(echo(prompt), False, 1)


class Switch:
    """An LLM that is down until `up` is set; counts the calls it refused."""

    def __init__(self) -> None:
        self.up = False
        self.refused = 0

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        if not self.up:
            self.refused += 1
            raise LlmUnavailable("connection refused")
        return Completion(echo(prompt), False, 1)


class FlakyCounter(WordCounter):
    def __init__(self) -> None:
        super().__init__()
        self.up = True

    async def count(self, texts: Sequence[str]) -> list[int]:
        if not self.up:
            raise Unavailable("injection: connection refused")
        return await super().count(texts)


class Recorder:
    def __init__(self) -> None:
        self.events: list[MergeEvent] = []

    async def on_merge(self, event: MergeEvent) -> None:
        self.events.append(event)


def service(
    stores: Stores,
    llm: object,
    counter: WordCounter | None = None,
    observer: Recorder | None = None,
) -> SummariserService:
    store = stores.make()
    counter = counter or WordCounter()
    config = MergeConfig(
        window_tokens=WINDOW,
        low_water_tokens=40,
        max_input_tokens=1000,
        summary=SummaryConfig(summary_tokens=400, style="extend"),
        backoff_initial_seconds=0.01,
        backoff_max_seconds=0.05,
        drain_seconds=0.1,
    )
    merger = Merger(store, counter, llm, config, observer, jitter=lambda: 1.0)  # type: ignore[arg-type]
    return SummariserService(store, counter, merger, Budgets(WINDOW, 400, 30.0))


async def test_append_returns_before_the_merge_and_merges_stay_in_order(stores: Stores) -> None:
    gate = Gate()
    recorder = Recorder()
    svc = service(stores, gate, observer=recorder)
    for i in range(6):
        result = await svc.append(KEY, exchange(i))
    assert result.merge_pending  # the LLM has not answered: Append did not wait
    await gate.entered.wait()
    assert (await svc.get(KEY)).session.turns_total == 12
    assert len(gate.prompts) == 1  # one merge at a time per session
    gate.open.set()
    view = await svc.flush(KEY, 10)
    assert not view.merge_pending and view.session.window_tokens <= WINDOW
    for i in range(6, 12):
        await svc.append(KEY, exchange(i))
    view = await svc.flush(KEY, 10)
    assert len(recorder.events) >= 2
    # Each merge's prompt starts from the summary the previous merge committed.
    committed = ""
    for prompt in gate.prompts:
        old = prompt.rsplit("\n\nSummary: ", 1)[1].split("\n", 1)[0]
        assert old == (committed or "none yet.")
        committed = f"{committed} {note(prompt)}".strip()
    assert view.session.summary == committed
    assert view.session.summary.startswith("Ada said: question 0 about item number 0")
    assert [e.version for e in recorder.events] == sorted(e.version for e in recorder.events)
    assert sum(len(e.merged_memory_ids) for e in recorder.events) == (24 - len(view.session.window))
    await svc.close()


async def test_llm_down_append_works_and_the_merge_happens_once_it_is_back(
    stores: Stores,
) -> None:
    llm = Switch()
    svc = service(stores, llm)
    for i in range(6):
        assert (await svc.append(KEY, exchange(i))).appended == 2
    view = await svc.flush(KEY, 0.3)  # bounded: the LLM is down
    assert view.merge_pending and view.session.summary == ""
    assert len(view.session.window) == 12  # nothing lost, all readable
    assert llm.refused >= 2  # retried with backoff
    assert view.session.stats.llm_failures >= 2
    llm.up = True
    view = await svc.flush(KEY, 10)
    assert not view.merge_pending and view.session.summary
    assert view.session.stats.merges >= 1
    await svc.close()


async def test_the_counter_down_stores_turns_uncounted_and_counts_them_later(
    stores: Stores,
) -> None:
    counter = FlakyCounter()
    counter.up = False
    svc = service(stores, ScriptedLlm(echo), counter)
    result = await svc.append(KEY, exchange(0))
    assert result.appended == 2 and result.merge_pending
    view = await svc.get(KEY)
    assert [t.tokens for t in view.session.window] == [None, None]
    counter.up = True
    view = await svc.flush(KEY, 10)
    assert all(t.tokens for t in view.session.window) and not view.merge_pending
    await svc.close()


async def test_a_merge_racing_forget_never_commits_the_forgotten_text(stores: Stores) -> None:
    gate = Gate()
    svc = service(stores, gate)
    for i in range(6):
        await svc.append(KEY, exchange(i))
    await gate.entered.wait()  # the first merge holds "question 0 ..." in its prompt
    forgotten = await svc.forget("acme", "u1", "s1", ["q0"])
    assert forgotten.turns_removed == 1
    gate.open.set()
    view = await svc.flush(KEY, 10)
    assert "question 0 " not in view.session.summary
    assert "answer 0" in view.session.summary  # the rest was merged again
    assert not view.merge_pending
    await svc.close()


async def test_concurrent_writers_lose_nothing(stores: Stores) -> None:
    svc = service(stores, ScriptedLlm(echo))
    await asyncio.gather(*(svc.append(KEY, exchange(i)) for i in range(40)))
    # The same turns again from a retrying writer: skipped, not doubled.
    await asyncio.gather(*(svc.append(KEY, exchange(i)) for i in range(0, 40, 3)))
    view = await svc.flush(KEY, 30)
    session = view.session
    assert session.turns_total == 80
    assert session.stats.turns_merged + len(session.window) == 80
    ids = {t.memory_id for t in session.window}
    assert len(ids) == len(session.window)
    await svc.close()


async def test_shutdown_mid_merge_loses_nothing_and_start_up_resumes(stores: Stores) -> None:
    gate = Gate()
    svc = service(stores, gate)
    for i in range(6):
        await svc.append(KEY, exchange(i))
    await gate.entered.wait()
    await svc.close()  # the merge is cancelled after the drain time
    again = service(stores, ScriptedLlm(echo))
    view = await again.get(KEY)
    assert len(view.session.window) == 12 and view.session.summary == ""
    assert await again.resume() == 1
    view = await again.flush(KEY, 10)
    assert view.session.summary and not view.merge_pending
    await again.close()


async def test_bad_requests_name_the_field(stores: Stores) -> None:
    svc = service(stores, ScriptedLlm(echo))
    with pytest.raises(InvalidArgument, match="session_id"):
        await svc.append(SessionKey("acme", "u1", ""), exchange(0))
    with pytest.raises(InvalidArgument, match=r"turns\[1\].text"):
        await svc.append(KEY, [exchange(0)[0], TurnIn("x", Role.USER, "", 0)])
    with pytest.raises(InvalidArgument, match=r"turns\[0\].text: 40000 bytes exceeds"):
        await svc.append(KEY, [TurnIn("x", Role.USER, "a" * 40000, 0)])
    with pytest.raises(InvalidArgument, match=r"turns: must hold 1\.\.1024"):
        await svc.append(KEY, [])
    # PostgreSQL's text cannot hold NUL: refused on both engines alike.
    with pytest.raises(InvalidArgument, match=r"turns\[0\].text: must not contain a NUL"):
        await svc.append(KEY, [TurnIn("x", Role.USER, "a\x00b", 0)])
    with pytest.raises(InvalidArgument, match="session_id: must not contain a NUL"):
        await svc.append(SessionKey("acme", "u1", "s\x00"), exchange(0))
    with pytest.raises(InvalidArgument, match=r"memory_ids\[0\]"):
        await svc.forget("acme", "u1", "", [""])
    await svc.close()
