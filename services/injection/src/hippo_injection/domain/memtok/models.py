"""Values of the memtok store.

A memtok is one salient operator word remembered with its context: a key vector (the
embedding model's space, searched through the vector-store port), a value vector (the
LLM's hidden space at the injection layer, kept compactly), the source words, a count, a
keep score, a source label and dates. Times are UTC epoch microseconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from hippo_injection.domain.types import MemoryStates

Vector = npt.NDArray[np.float32]


class Source(enum.StrEnum):
    OPERATOR = "operator"  # the person's own words: may raise counts
    MODEL = "model"  # the model's reply words (promoted from the buffer when echoed)


class Packing(enum.StrEnum):
    FLOAT16 = "f16"  # the normal compact form
    INT8 = "i8"  # a weak item compressed before it is deleted


@dataclass(frozen=True)
class Observation:
    """One word that LLM1 ranked in a turn: the candidate for admission."""

    word: str  # the word as written
    source_words: str  # the word with a few words of context around it
    rank: float  # LLM1 salience in [0, ~1.3] (conditions add a bonus)
    surprise: float  # -log p of the word's tokens, nats
    attention: float  # attention received relative to uniform, per available attender
    emphasis: float = 0.0  # operator emphasis in [0, 1] (caps, "!", "important")
    stakes: float = 0.0  # safety/health/money/deadline words nearby, [0, 1]
    conditional: bool = False  # in a clause with only if / never / always / must


@dataclass
class Memtok:
    id: str
    tenant: str
    user: str
    word: str
    source_words: str
    key: Vector  # unit, embedding space
    value: Vector  # float32 in memory; packed in storage (`packing`)
    layer: int
    model_id: str
    count: int
    keep: float
    rank_max: float
    surprise: float
    emphasis: float
    stakes: float
    conditional: bool
    source: Source
    created_us: int
    last_seen_us: int
    grace_until_us: int
    packing: Packing = Packing.FLOAT16
    resurface_at_us: int = 0  # 0: not marked; otherwise when to resurface if dormant
    # The source words' attendable key/value states (issue 20): given to `put` to store
    # them; items read back carry None (the store reads them apart: `ItemStore.states`).
    states: MemoryStates | None = None


@dataclass(frozen=True)
class Written:
    """What one admission did to one observation."""

    word: str
    outcome: str  # "new", "merged", "seen" (model source: no count), "rejected"
    memtok_id: str = ""
    reason: str = ""  # for "rejected": "below_min_rank", "store_full", ...
    count: int = 0


@dataclass(frozen=True)
class Removed:
    memtok_id: str
    word: str
    outcome: str  # "compressed" or "evicted"
    keep: float
    count: int


@dataclass
class WriteReport:
    written: list[Written] = field(default_factory=list)
    removed: list[Removed] = field(default_factory=list)
    buffered: int = 0  # reply words waiting for the next query
    promoted: list[str] = field(default_factory=list)  # reply words the query echoed

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in self.written:
            out[w.outcome] = out.get(w.outcome, 0) + 1
        for r in self.removed:
            out[r.outcome] = out.get(r.outcome, 0) + 1
        return out

    def audit_body(self) -> dict[str, object]:
        """What was written, merged, compressed and evicted, in the clear: outcomes, ids,
        counts and keep scores; words that were rejected are only counted. No words
        (see `private_body`)."""
        rejected: dict[str, int] = {}
        for w in self.written:
            if w.outcome == "rejected":
                rejected[w.reason] = rejected.get(w.reason, 0) + 1
        return {
            "writes": [
                {"outcome": w.outcome, "memtok_id": w.memtok_id, "count": w.count}
                for w in self.written
                if w.outcome != "rejected"
            ],
            "rejected": rejected,
            "removed": [
                {"memtok_id": r.memtok_id, "outcome": r.outcome, "keep": round(r.keep, 4)}
                for r in self.removed
            ],
            "buffered": self.buffered,
            "promoted": len(self.promoted),
        }

    def private_body(self) -> dict[str, object]:
        """The words behind the public body (the audit log seals them per user)."""
        return {
            "words": {w.memtok_id: w.word for w in self.written if w.memtok_id},
            "removed": {r.memtok_id: r.word for r in self.removed},
            "promoted": list(self.promoted),
        }


@dataclass(frozen=True)
class Changes:
    """What the item store's change feed says about a span of changes: the items written
    in it as they are now, and the ids (with their tenant) that no longer exist. The key
    index applies both and so becomes the store's projection up to the span's end."""

    live: list[Memtok] = field(default_factory=list)
    gone: list[tuple[str, str]] = field(default_factory=list)  # (tenant, memtok id)


class StoreModelMismatch(RuntimeError):
    """The store's value vectors belong to another model (or layer); rebuild it."""
