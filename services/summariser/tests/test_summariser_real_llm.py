"""End to end on the real model: the summariser merges through the injection host's TGI
API with the real text_generation client (Gemma 3 270M base, greedy), and validation
makes the committed summary keep every fact whatever the small model wrote."""

from __future__ import annotations

import json
from pathlib import Path

from summariser_harness import Injection, append, flush, ready, stub, summariser

from hippo.memory.v1 import memory_pb2
from hippo.summariser.v1 import summariser_pb2 as pb
from hippo_core.testing import metric, scrape

MAY_8 = 1_683_504_000_000_000
CHAT = [
    ("Caroline", "I went to the LGBTQ support group on Tuesday and met Dana there."),
    ("Melanie", "That sounds great! How many people came?"),
    ("Caroline", "About 14 people. Dana runs a bakery called Sweet Loaf on Pine Street."),
    ("Melanie", "I painted a lake sunrise last year, it took me 3 weeks."),
    ("Caroline", "I want to study counseling; the course fee is $1,200 per term."),
    ("Melanie", "You would be a great counselor, Caroline."),
    ("Caroline", "Thanks! My adoption interview is on 12 June at 10am."),
    ("Melanie", "Good luck, I will bring my 2 kids to cheer you up."),
]


def test_a_real_merge_is_validated_and_keeps_every_fact(
    tmp_path: Path, injection: Injection
) -> None:
    turns = [
        pb.SessionTurn(
            memory_id=f"m{i}",
            role=memory_pb2.ROLE_USER if i % 2 == 0 else memory_pb2.ROLE_ASSISTANT,
            text=text,
            time_us=MAY_8,
            speaker=speaker,
        )
        for i, (speaker, text) in enumerate(CHAT)
    ]
    with summariser(
        tmp_path / "data",
        injection.addr,
        injection.http,  # the injection host's TGI-compatible API
        window_tokens="100",
        summary_tokens="96",
        merge_input_tokens="4096",
        llm_timeout_seconds="200",
        # The LLM path itself: `auto` picks the extractive merge for this base model.
        merge_mode="llm",
    ) as proc:
        s = stub(ready(proc))
        for i in range(0, len(turns), 2):
            append(s, turns[i : i + 2])
        state = flush(s, timeout=280)
        samples = scrape(proc.metrics_url)
    assert not state.merge_pending, proc.log_text()[-2000:]
    stats = state.merge_stats
    assert stats.merges >= 1 and stats.turns_merged >= 4
    assert 0 < state.summary_tokens <= state.summary_budget == 96
    assert state.window_tokens <= state.window_budget
    # Whatever the 270M base model wrote, the committed summary holds the merged facts.
    assert stats.facts > 0 and stats.facts_kept == stats.facts
    assert 0.0 <= stats.last_retention_llm <= 1.0 and stats.last_retention == 1.0
    assert "14" in state.summary and "Dana" in state.summary
    # The few-shot examples' inventions never reach the summary.
    for invented in ("Feedzai", "KX-4471", "Miso", "Pixel", "Lisbon", "$240"):
        assert invented not in state.summary
    assert metric(samples, "hippo_summariser_merges_total", result="committed") >= 1
    assert metric(samples, "hippo_summariser_llm_errors_total") == 0
    merged = [json.loads(line) for line in proc.log_text().splitlines() if '"merged"' in line]
    assert merged and all(m["mode"] == "llm" and m["llm_calls"] >= 1 for m in merged)
