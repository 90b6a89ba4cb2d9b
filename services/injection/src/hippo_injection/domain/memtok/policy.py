"""The store's rules as pure functions: rank, keep score, conditions, stakes, eviction
order and influence strength. Every number comes from `Policy` (the service settings)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hippo_injection.domain.memtok.models import Memtok, Observation

US_PER_DAY = 86_400_000_000

CONDITION_RE = re.compile(r"\b(only if|never|always|must|must not|unless)\b", re.IGNORECASE)
STAKES_RE = re.compile(
    r"\b(allerg\w*|danger\w*|safe\w*|unsafe|emergenc\w*|medic\w*|doctor|hospital|health|"
    r"pills?|dose|insulin|asthma|diabet\w*|pregnan\w*|money|pay\w*|bank|card|rent|debt|"
    r"loan|salary|\$\d+|€\d+|deadline|due|urgent|by (monday|tuesday|wednesday|thursday|"
    r"friday|saturday|sunday|tomorrow|tonight))\b",
    re.IGNORECASE,
)
EMPHASIS_RE = re.compile(r"\b(important|remember|crucial|please note|don't forget)\b", re.I)


@dataclass(frozen=True)
class Policy:
    capacity: int = 2000  # items per tenant and user
    min_rank: float = 0.45  # below: never stored...
    # ...except an operator turn's best word when none reaches min_rank and it reaches
    # this: every statement leaves a memtok ("My favourite colour is teal." ranks its
    # best word 0.38; 14 of the 60 bench facts admitted nothing at 0.45 alone).
    min_rank_best: float = 0.3
    attention_weight: float = 0.5  # rank = w * attention part + (1 - w) * surprise part
    attention_cap: float = 4.0  # attention ratio (vs uniform) that counts as full
    surprise_cap: float = 12.0  # nats that count as full surprise
    condition_bonus: float = 0.15  # added to rank in a conditional clause
    grace_days: float = 7.0  # new items are not evicted before this
    merge_similarity: float = 0.9  # key cosine at or above: same memtok (same word)
    count_cap: int = 8  # counts above add no strength
    condition_cap: float = 1.5  # cap multiplier of conditional items
    half_life_days: float = 30.0  # influence decay since last seen (never survival)
    min_similarity: float = 0.35  # below: an item injects nothing
    base_strength: float = 0.06  # x layer norm; the sweep's best safe residual setting
    keep_weights: tuple[float, float, float, float] = (0.4, 0.2, 0.2, 0.2)  # rank, surprise,
    # emphasis, stakes
    compress_below: float = 0.25  # keep score under which an item is packed to int8 first
    reply_buffer: int = 64  # reply words waiting for the next query, per user


def rank(attention: float, surprise: float, conditional: bool, policy: Policy) -> float:
    """LLM1 salience of a word: attention received (vs uniform, per available attender)
    and surprise, each scaled to [0, 1] by its cap, weighted; conditions add a bonus."""
    a = min(max(attention, 0.0) / policy.attention_cap, 1.0)
    s = min(max(surprise, 0.0) / policy.surprise_cap, 1.0)
    value = policy.attention_weight * a + (1.0 - policy.attention_weight) * s
    return value + (policy.condition_bonus if conditional else 0.0)


def conditional(text: str) -> bool:
    return CONDITION_RE.search(text) is not None


def stakes(text: str) -> float:
    """1 when the words around mention safety, health, money or a deadline."""
    return 1.0 if STAKES_RE.search(text) else 0.0


def emphasis(word: str, text: str) -> float:
    """Operator emphasis: an all-caps word, an exclamation or an explicit marker."""
    score = 0.0
    if len(word) > 1 and word.isupper():
        score += 0.5
    if "!" in text:
        score += 0.25
    if EMPHASIS_RE.search(text):
        score += 0.5
    return min(score, 1.0)


def keep_score(
    rank_max: float, surprise: float, emphasis_: float, stakes_: float, p: Policy
) -> float:
    """Set at write from the highest rank ever seen, surprise, emphasis and stakes; it
    never fades with disuse."""
    wr, ws, we, wk = p.keep_weights
    return (
        wr * min(rank_max, 1.5)
        + ws * min(surprise / p.surprise_cap, 1.0)
        + we * emphasis_
        + wk * stakes_
    )


def keep_for(item: Memtok, p: Policy) -> float:
    return keep_score(item.rank_max, item.surprise, item.emphasis, item.stakes, p)


def keep_of(obs: Observation, p: Policy) -> float:
    return keep_score(obs.rank, obs.surprise, obs.emphasis, obs.stakes, p)


def eviction_key(item: Memtok) -> tuple[float, int, int]:
    """Lowest keep score first, then lowest count, then oldest. Nothing about use: an
    item is never evicted for being unreferenced."""
    return (item.keep, item.count, item.created_us)


def decay(item: Memtok, now_us: int, p: Policy) -> float:
    """Influence decay since the item was last seen (0.5 per half-life). Survival never
    depends on it."""
    if p.half_life_days <= 0:
        return 1.0
    days = max(now_us - item.last_seen_us, 0) / US_PER_DAY
    return math.pow(0.5, days / p.half_life_days)


def strength(item: Memtok, similarity: float, now_us: int, p: Policy) -> float:
    """capped count x time decay x similarity (x the base strength); zero below the
    minimum similarity, so a thin store injects nothing rather than noise."""
    if similarity < p.min_similarity:
        return 0.0
    cap = p.count_cap * (p.condition_cap if item.conditional else 1.0)
    counted = min(float(item.count), cap) / p.count_cap
    return p.base_strength * counted * decay(item, now_us, p) * similarity
