"""LLM1 salience: from the model's per-token attention and surprise to ranked words.

A word's attention is the highest of its tokens' (a name split in pieces is as salient as
its most attended piece); its surprise is the sum of its tokens' (-log p of the word).
Conditional wording (only if, never, always, must), stakes and emphasis are read from
the word's sentence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from hippo_injection.domain.engine import Engine
from hippo_injection.domain.memtok import policy as rules
from hippo_injection.domain.memtok.models import Observation
from hippo_injection.domain.memtok.policy import Policy

WORD_RE = re.compile(r"[$€£]?\w[\w'’.-]*\w|[$€£]?\w")
SENTENCE_RE = re.compile(r"[^.!?;\n]+[.!?;]?")


@dataclass(frozen=True)
class Scored:
    """The model's view of one text: its token ids (with <bos>) and per-token scores."""

    ids: tuple[int, ...]
    attention: tuple[float, ...]
    surprise: tuple[float, ...]
    offsets: tuple[tuple[int, int], ...]  # per token after <bos>


def score_text(engine: Engine, text: str) -> Scored:
    """One forward pass of LLM1 over `text` (blocking: the model's thread)."""
    ids = [engine.bos_id, *engine.tokenize(text)]
    attention, surprise = engine.token_salience(ids)
    return Scored(tuple(ids), tuple(attention), tuple(surprise), tuple(engine.offsets(text)))


def observe(text: str, scored: Scored, policy: Policy, context_words: int = 3) -> list[Observation]:
    """Every word of `text` with its rank, best first; one per distinct word (the
    highest-ranked occurrence)."""
    words = list(WORD_RE.finditer(text))
    sentences = [(m.start(), m.end(), m.group(0)) for m in SENTENCE_RE.finditer(text)]
    best: dict[str, Observation] = {}
    for index, match in enumerate(words):
        start, end = match.span()
        tokens = [
            i + 1  # +1: position 0 is <bos>
            for i, (a, b) in enumerate(scored.offsets)
            if a < end and b > start
        ]
        if not tokens:
            continue
        attention = max(scored.attention[t] for t in tokens)
        surprise = sum(scored.surprise[t] for t in tokens)
        sentence = next((s for a, b, s in sentences if a <= start < b), text)
        conditional = rules.conditional(sentence)
        lo, hi = max(index - context_words, 0), index + context_words + 1
        obs = Observation(
            word=match.group(0),
            source_words=" ".join(w.group(0) for w in words[lo:hi]),
            rank=rules.rank(attention, surprise, conditional, policy),
            surprise=surprise,
            attention=attention,
            emphasis=rules.emphasis(match.group(0), sentence),
            stakes=rules.stakes(sentence),
            conditional=conditional,
        )
        key = obs.word.casefold()
        if key not in best or obs.rank > best[key].rank:
            best[key] = obs
    return sorted(best.values(), key=lambda o: -o.rank)


def select(observations: Sequence[Observation], share: float) -> list[Observation]:
    """The query's mid-to-high-value words: the top `share` of them by rank (at least
    one when there are any)."""
    if not observations:
        return []
    n = max(1, math.ceil(share * len(observations)))
    return sorted(observations, key=lambda o: -o.rank)[:n]
