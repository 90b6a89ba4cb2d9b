"""The per-query influence pipeline (DESIGN.md §Influence):

1. LLM1 ranks the query's words; a fixed share of the best is selected;
2. they are embedded together and a wide shortlist (50-200) is taken from the store;
3. LLM2 (the same weights, stopped at a middle layer, output discarded) re-scores each
   candidate by the attention the query pays to its source words;
4. salience (the item's highest LLM1 rank), similarity and LLM2 are merged with weights;
5. the winners' value vectors get strength = capped count x time decay x similarity,
   zero below the minimum similarity (a thin store injects nothing); or, with the
   `attend` route, the winners' stored key/value states are attended instead (issue 20:
   the memory as positions the prompt reads, computed once when the item was stored),
   within a cap on their total tokens.

After the reply: the query's words are ranked and written, the reply's wait in the
buffer. Every step is recorded in `Plan` / `WriteReport`, whose audit bodies are what the
gateway logs and what the disclosure note is written from. Blocking: the model's thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from hippo_injection.domain.engine import Engine
from hippo_injection.domain.memtok import policy as rules
from hippo_injection.domain.memtok import salience
from hippo_injection.domain.memtok.models import Source, WriteReport
from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.types import Attendable, Influence, MemoryStates, Positions


class Mode(StrEnum):
    OFF = "off"  # nothing selected, nothing applied
    DISCLOSE_ONLY = "disclose_only"  # selected and disclosed, not applied
    ON = "on"  # selected, applied, disclosed


@dataclass(frozen=True)
class Weights:
    """Merge weights of the three scores (each normalised to [0, 1] over the shortlist)."""

    # Tuned on the even probes of bench/influence_eval.py (grid 0-1 in steps of 0.25):
    # the item's own salience only hurt, similarity carries it, LLM2 breaks ties.
    salience: float = 0.0
    similarity: float = 1.0
    llm2: float = 0.25


class Route(StrEnum):
    RESIDUAL = "residual"  # the winners' value vectors added to the residual stream
    ATTEND = "attend"  # the winners' stored states attended before the prompt


@dataclass(frozen=True)
class PipelineSettings:
    layer: int = 3  # the sweep's best safe residual layer
    shortlist: int = 100  # 50-200
    llm2_layer: int = 6  # LLM2 stops after this layer
    llm2_keep: int = 16  # candidates kept after merging (the "LLM2 kept" count)
    max_inject: int = 4  # winners applied at most
    select_share: float = 0.3  # share of the query's words selected by LLM1
    weights: Weights = field(default_factory=Weights)
    route: Route = Route.RESIDUAL
    attend_tokens: int = 256  # the attended states' tokens, all winners together


@dataclass(frozen=True)
class Applied:
    memtok_id: str
    word: str
    similarity: float
    merged: float
    strength: float
    count: int

    tokens: int = 0  # attended: the states' positions (0: a residual influence)

    def body(self, layer: int) -> dict[str, object]:
        body: dict[str, object] = {
            "memtok_id": self.memtok_id,
            "layer": layer,
            "strength": round(self.strength, 6),
            "similarity": round(self.similarity, 4),
            "merged_score": round(self.merged, 4),
            "count": self.count,
        }
        if self.tokens:
            body["route"], body["tokens"] = Route.ATTEND.value, self.tokens
        return body


@dataclass
class Plan:
    mode: Mode
    layer: int
    selected: list[tuple[str, float]] = field(default_factory=list)  # (word, rank)
    shortlist: int = 0
    top_similarity: float = 0.0
    llm2_kept: int = 0
    applied: list[Applied] = field(default_factory=list)
    skipped: list[dict[str, object]] = field(default_factory=list)
    promoted: WriteReport = field(default_factory=WriteReport)
    influences: list[Influence] = field(default_factory=list)  # empty unless mode ON
    # The attend route's winners' states (None unless mode ON and that route).
    attendable: Attendable | None = None
    # LLM2's kept candidates, best merged score first: (memtok id, salience, similarity,
    # LLM2 score, merged). For measurement (bench/influence_eval.py), not the audit log.
    ranked: list[tuple[str, float, float, float, float]] = field(default_factory=list)

    def audit_body(self) -> dict[str, object]:
        """The steps as the audit log records them in the clear: ids and numbers, never
        the user's words (those are in `private_body`) and never vectors."""
        return {
            "influence_mode": self.mode.value,
            "selected": [round(r, 4) for _, r in self.selected],  # ranks of the words chosen
            "shortlist": self.shortlist,
            "top_similarity": round(self.top_similarity, 4),
            "llm2_kept": self.llm2_kept,
            "influences": [a.body(self.layer) for a in self.applied],
            "skipped": list(self.skipped),
            "promoted": len(self.promoted.promoted),
            "writes": self.promoted.audit_body()["writes"],
        }

    def private_body(self) -> dict[str, object]:
        """The words behind the public body (the audit log seals them per user)."""
        return {
            "selected": [w for w, _ in self.selected],
            "words": {a.memtok_id: a.word for a in self.applied},
            "promoted": list(self.promoted.promoted),
        }


def _normalised(values: list[float]) -> list[float]:
    if not values:
        return []
    lo, hi = min(values), max(values)
    return [0.0 if hi <= lo else (v - lo) / (hi - lo) for v in values]


class InfluencePipeline:
    def __init__(self, engine: Engine, store: MemtokStore, settings: PipelineSettings) -> None:
        self.engine = engine
        self.store = store
        self.settings = settings

    @property
    def policy(self) -> rules.Policy:
        return self.store.policy

    def plan(self, tenant: str, user: str, query: str, now_us: int, mode: Mode) -> Plan:
        s = self.settings
        attend = self.store.attend
        layer = attend.from_layer if s.route is Route.ATTEND and attend is not None else s.layer
        plan = Plan(mode, layer)
        if mode is Mode.OFF:
            return plan  # nothing is selected, nothing is written into the plan
        plan.promoted = self.store.promote(tenant, user, query, now_us)
        observed = salience.observe(query, salience.score_text(self.engine, query), self.policy)
        chosen = salience.select(observed, s.select_share)
        plan.selected = [(o.word, o.rank) for o in chosen]
        if not chosen:
            plan.skipped.append({"reason": "no_words"})
            return plan
        key = self.store.embedder.embed([" ".join(o.word for o in chosen)])[0]
        hits = self.store.search(tenant, user, key, s.shortlist)
        plan.shortlist = len(hits)
        plan.top_similarity = max((sim for _, sim in hits), default=0.0)
        if not hits:
            plan.skipped.append({"reason": "empty_store"})
            return plan
        llm2 = self._llm2(query, [m.source_words for m, _ in hits])
        # The three scores merged over the whole shortlist; the best `llm2_keep` are kept.
        # (LLM2 alone as a pre-filter lost the right item: bench/influence_eval.py.)
        sal = _normalised([m.rank_max for m, _ in hits])
        l2 = _normalised(llm2)
        w = s.weights
        merged = [
            w.salience * sal[i] + w.similarity * hits[i][1] + w.llm2 * l2[i]
            for i in range(len(hits))
        ]
        order = sorted(range(len(hits)), key=lambda i: -merged[i])[: s.llm2_keep]
        kept = [(hits[i][0], hits[i][1], llm2[i]) for i in order]
        plan.llm2_kept = len(kept)
        plan.ranked = [(hits[i][0].id, sal[i], hits[i][1], l2[i], merged[i]) for i in order]
        merged = [merged[i] for i in order]
        ranked = list(range(len(kept)))
        strengths = [rules.strength(item, sim, now_us, self.policy) for item, sim, _ in kept]
        attending = s.route is Route.ATTEND
        # States are tens of KiB each: read those of the candidates that can be applied.
        stored = (
            self.store.items.states(
                tenant, user, [kept[i][0].id for i in ranked if strengths[i] > 0.0]
            )
            if attending
            else {}
        )
        attended: list[MemoryStates] = []
        for i in ranked:
            item, similarity, _ = kept[i]
            strength = strengths[i]
            if strength <= 0.0:
                plan.skipped.append(
                    {"memtok_id": item.id, "reason": "below_min_similarity",
                     "similarity": round(similarity, 4)}
                )  # fmt: skip
                continue
            if len(plan.applied) >= s.max_inject:
                plan.skipped.append({"memtok_id": item.id, "reason": "over_max_inject"})
                continue
            states = stored.get(item.id)
            tokens = 0
            if attending:
                if states is None:  # stored before states were kept: `hippo memtok rebuild`
                    plan.skipped.append({"memtok_id": item.id, "reason": "no_states"})
                    continue
                tokens = states.tokens
                if sum(a.tokens for a in plan.applied) + tokens > s.attend_tokens:
                    plan.skipped.append({"memtok_id": item.id, "reason": "over_attend_tokens"})
                    continue
            plan.applied.append(
                Applied(item.id, item.word, similarity, merged[i], strength, item.count, tokens)
            )
            if mode is Mode.ON and states is not None:
                attended.append(states)
            elif mode is Mode.ON:
                plan.influences.append(Influence(item.value, s.layer, strength, Positions.ALL))
        if attended:
            plan.attendable = Attendable(from_layer=attended[0].from_layer, states=tuple(attended))
        return plan

    def _llm2(self, query: str, sources: list[str]) -> list[float]:
        """Attention the query pays to each candidate's source words, up to the middle
        layer: candidates one per line, then the query."""
        ids = [self.engine.bos_id]
        spans: list[tuple[int, int]] = []
        for text in sources:
            start = len(ids)
            ids += self.engine.tokenize(text + "\n")
            spans.append((start, len(ids)))
        start = len(ids)
        ids += self.engine.tokenize(query)
        return self.engine.span_attention(ids, spans, (start, len(ids)), self.settings.llm2_layer)

    def write(self, tenant: str, user: str, query: str, reply: str, now_us: int) -> WriteReport:
        """After the reply: the operator's words ranked and admitted; the reply's ranked
        words wait in the buffer for the next query."""
        # Reply words this query echoes (if no plan took them already), then its own.
        promoted = self.store.promote(tenant, user, query, now_us)
        observed = salience.observe(query, salience.score_text(self.engine, query), self.policy)
        report = self.store.admit(tenant, user, observed, now_us, Source.OPERATOR)
        report.written[:0] = promoted.written
        report.removed[:0] = promoted.removed
        report.promoted = promoted.promoted
        if reply.strip():
            said = salience.observe(reply, salience.score_text(self.engine, reply), self.policy)
            report.buffered = self.store.buffer_reply(tenant, user, said, now_us)
        return report
