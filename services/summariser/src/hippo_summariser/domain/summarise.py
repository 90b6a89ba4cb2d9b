"""One merge: the old summary + the dropped turns -> a validated summary (no storage).

1. Ask the LLM (prompt.py) and clean its answer to one plain-prose paragraph.
2. Remove sentences that state facts no source holds (a small model copies its examples).
3. Check the facts of the dropped turns (facts.py). If some are missing, ask once more
   with a stricter prompt that lists them; keep whichever answer retains more.
4. Append the still-missing facts in one compact sentence, and fit the result in
   `summary_tokens` (counted with the model's tokenizer): the oldest prose sentences go
   first, then facts of the old summary, then (only if even the facts alone are too long)
   the oldest facts of the dropped turns, so a summary always ends with the newest ones.
   The retention reported is what survives.

Facts of the old summary are carried too: a rewrite that loses most of them is treated as
an extension (old summary + the new text), and those it lost are re-added when they fit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from hippo_summariser import metrics
from hippo_summariser.domain import facts, prompt
from hippo_summariser.domain.facts import Fact
from hippo_summariser.domain.models import MergeOutcome, WindowTurn
from hippo_summariser.domain.ports import Llm, LlmRejected, TokenCounter

log = structlog.stdlib.get_logger("hippo.summariser.merge")

MAX_MUST = 24  # facts listed in the stricter prompt (a longer list drowns the turns)


@dataclass(frozen=True)
class SummaryConfig:
    summary_tokens: int
    style: str = "rewrite"  # "rewrite" | "extend" (prompt.py)
    strict_retry: bool = True
    max_chars_per_turn: int = 2000
    # "llm" | "extractive" (extractive.py, no LLM) | "auto": extractive when the LLM is
    # the built-in base model (the merge worker asks it once).
    mode: str = "llm"


def _join(*parts: str) -> str:
    return " ".join(p.strip() for p in parts if p and p.strip())


@dataclass(frozen=True)
class _Attempt:
    prose: str
    invented: int


async def _attempt(
    summary: str,
    turns: Sequence[WindowTurn],
    must: Sequence[str],
    carried: Sequence[Fact],
    sources: facts.Index,
    llm: Llm,
    config: SummaryConfig,
    neutralise: prompt.Neutralise,
) -> _Attempt:
    text, _ = prompt.build(
        summary,
        turns,
        must=must,
        style=config.style,
        max_chars_per_turn=config.max_chars_per_turn,
        neutralise=neutralise,
    )
    try:
        done = await llm.complete(text, max_new_tokens=config.summary_tokens, stop=prompt.STOP)
        answer, cut = done.text, done.cut_by_length
    except LlmRejected as exc:
        # Retrying the same prompt cannot help; the repair below still keeps the facts,
        # so the merge makes progress instead of blocking the session.
        metrics.LLM_ERRORS.labels("rejected").inc()
        log.warning("llm_rejected_merge", error=str(exc))
        answer, cut = "", False
    if config.style == "extend":
        anchor = prompt.label(turns[0])
        new = prompt.clean(anchor + answer, cut_by_length=cut) if answer.strip() else ""
    else:
        new = prompt.clean(answer, cut_by_length=cut)
    said = facts.sentences(new)
    honest = [s for s in said if not facts.invented(s, sources)]
    if config.style == "extend":
        # The note is appended to the summary: a sentence it already holds adds nothing
        # (base models copy their context).
        held = {s.lower() for s in facts.sentences(summary)}
        honest = [s for s in honest if s.lower() not in held]
    new = " ".join(honest)
    if (
        config.style == "extend"
        or not new
        or (carried and facts.kept_count(carried, new) * 2 < len(carried))
    ):
        prose = _join(summary, new)
    else:
        prose = new
    return _Attempt(_unique(prose), len(said) - len(honest))


def _unique(prose: str) -> str:
    """Each sentence once (a small model restates what the summary already says)."""
    seen: set[str] = set()
    out = []
    for sentence in facts.sentences(prose):
        if sentence.lower() not in seen:
            seen.add(sentence.lower())
            out.append(sentence)
    return " ".join(out)


async def fit(
    prose: str,
    required: Sequence[Fact],
    carried: Sequence[Fact],
    cap: int,
    counter: TokenCounter,
) -> tuple[str, int]:
    """The summary to commit and its tokens: prose + a sentence of the missing facts, at
    most `cap` tokens (see the module docstring for what goes first)."""
    body = facts.sentences(prose)
    carried_missing = facts.missing(carried, prose)
    for start in range(len(body) + 1):
        text = " ".join(body[start:])
        lost = facts.missing(required, text)
        for extra in [carried_missing, []] if carried_missing else [[]]:
            candidate = _join(text, facts.facts_sentence([*lost, *extra]))
            n = (await counter.count([candidate]))[0] if candidate else 0
            if n <= cap:
                return candidate, n
    listed = list(required)
    while listed:
        listed.pop(0)  # oldest first, as with the prose: the newest facts matter most next
        candidate = facts.facts_sentence(listed)
        n = (await counter.count([candidate]))[0] if candidate else 0
        if n <= cap:
            return candidate, n
    return "", 0


async def summarise(
    summary: str,
    turns: Sequence[WindowTurn],
    llm: Llm,
    counter: TokenCounter,
    config: SummaryConfig,
    neutralise: prompt.Neutralise = prompt.GEMMA.neutralise,
) -> MergeOutcome:
    """Merge `turns` (whole exchanges, oldest first) into `summary`. Raises LlmUnavailable
    (or the counter's HippoError) when it cannot finish now; nothing is stored here.
    `neutralise` guards the prompt against the serving model's control tokens."""
    required = facts.extract_all((t.text, prompt.label(t)) for t in turns)
    known = {(f.kind, f.key) for f in required}
    carried = [f for f in facts.extract(summary) if (f.kind, f.key) not in known]
    sources = facts.index(
        "\n".join(
            [
                summary,
                *(f"{prompt.label(t)}: {t.text}" for t in turns),
                *{prompt.day(t.time_us) for t in turns},
            ]
        )
    )
    first = await _attempt(summary, turns, (), carried, sources, llm, config, neutralise)
    calls, invented = 1, first.invented
    kept_llm = facts.kept_count(required, first.prose)
    best = first.prose
    if kept_llm < len(required) and config.strict_retry:
        must = [f.text for f in required][:MAX_MUST]
        second = await _attempt(summary, turns, must, carried, sources, llm, config, neutralise)
        calls, invented = 2, invented + second.invented
        metrics.REPAIRS.labels("strict_retry").inc()
        if facts.kept_count(required, second.prose) > kept_llm:
            best = second.prose
    final, tokens = await fit(best, required, carried, config.summary_tokens, counter)
    repaired = bool(facts.missing(required, best)) and final != best
    if repaired:
        metrics.REPAIRS.labels("facts_sentence").inc()
    if invented:
        metrics.REPAIRS.labels("invented_sentence").inc(invented)
    return MergeOutcome(
        summary=final,
        summary_tokens=tokens,
        facts=len(required),
        kept_llm=kept_llm,
        kept=facts.kept_count(required, final),
        llm_calls=calls,
        repaired=repaired,
        invented_dropped=invented,
    )
