"""The extractive merge: the old summary + the dropped turns -> fact lines, no LLM.

The built-in model (Gemma 3 270M base) cannot summarise: on a bulk load its merges kept
~13% of the facts before validation, every merge needed the strict retry and the
appended facts sentence, and each took up to minutes of CPU. This merge keeps the
sentences that carry the facts instead, in milliseconds and deterministically:

1. Split each dropped turn into sentences (clauses, for a run-on sentence) and find the
   facts each holds with facts.py (names, numbers, dates, times, identifiers).
2. Pick them most salient first (more distinct facts, then more content words): a
   piece is kept if it states a fact the summary and the pieces kept so far do not hold;
   otherwise only if it tells (a question asks), is not a near-duplicate of a kept line
   (token overlap) and brings content words nothing kept has (one for a piece about a
   known name or number, three without any). The participants' names are no reason to
   keep a sentence ("Thanks, Mel!"): whom a kept line addressed goes in its prefix. So
   a sentence, or a fact, already in the summary is not repeated, and a restatement is
   dropped while the fullest one stays.
3. Write the kept pieces of a turn as one short line, with its date and speaker:
   "8 May 2023, Ana: ran the Porto half marathon in 1:58; Joana came too." (openers such
   as "Wow," and a leading "I" are dropped: the speaker prefix says who).
4. Fit `summary_tokens` with the same counter as `fit`, each step oldest first (the
   old summary's lines are older than the new ones): sentences without facts go (a
   line's chatter before its facts), then sentences with facts are cut to the clauses
   that hold them, then they go too; so a summary always ends with the newest facts.
   If even the newest line alone is too long, `fit`'s last resort lists the newest
   facts.

The summary stays one paragraph of sentences, so `facts.sentences` reads its lines back
at the next merge, and the LLM mode can continue it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hippo_summariser.domain import facts, prompt
from hippo_summariser.domain.facts import Fact
from hippo_summariser.domain.models import MergeOutcome, WindowTurn
from hippo_summariser.domain.ports import TokenCounter
from hippo_summariser.domain.summarise import fit

# A piece without a new fact needs this many content words nothing kept already has:
# "That's so cool!" carries nothing, "researching adoption agencies near the coast"
# does. One about a known name or number needs one ("Joana got promoted").
MIN_NOVEL_WORDS = 3
# A piece is a near-duplicate when this share of its content words is in one kept line.
OVERLAP = 0.8
# A sentence longer than this (words) is split into clauses, so its facts can be kept
# without its padding.
MAX_WORDS = 40

_STOP = facts.COMMON | frozenset((
    "am", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had", "do",
    "does", "did", "doing", "will", "would", "can", "could", "should", "shall", "might",
    "must", "may", "get", "got", "getting", "really", "very", "much", "lot", "lots",
    "thing", "things", "stuff", "kind", "sort", "know", "think", "mean", "feel", "feels",
    "that's", "what's", "there's", "you're", "we're", "they're", "he's", "she's", "let's",
    "don't", "can't", "didn't", "doesn't", "isn't", "wasn't", "won't", "haven't", "i’m",
    "it’s", "that’s", "don’t", "can’t", "you", "me", "us", "said", "say", "says", "going",
    "gonna", "wanna", "even", "ever", "always", "never", "something", "anything",
    "everything", "someone", "anyone", "everyone", "how", "way", "time", "right", "sounds",
    # reactions: they say how the speaker feels about the last line, not what happened
    "amazing", "wonderful", "fantastic", "beautiful", "incredible", "lovely", "proud",
    "happy", "exciting", "excited", "fun", "hope", "wish", "sweet", "interesting",
    "glad", "sorry", "true", "agree", "absolutely", "exactly", "indeed", "appreciate",
))  # fmt: skip
_OPENER = re.compile(
    r"^(?:(?:hey|hi|hello|oh|wow|whoa|yeah|yes|yep|yup|ok|okay|so|well|haha|lol|"
    r"omg|aww|ugh|hmm|thanks|thank you|congrats|congratulations|sure|cool|great|awesome|"
    r"nice|amazing|wonderful|honestly|anyway|btw)\b[\s]*[,!.…]+\s*)+",
    re.I,
)
# A leading first-person subject, in the third person the speaker prefix implies.
_SUBJECT = (
    (re.compile(r"^I(?:['’]m| am)\s+"), "is "),
    (re.compile(r"^I(?:['’]ve| have)\s+"), "has "),
    (re.compile(r"^I['’]d\s+"), "would "),
    (re.compile(r"^I['’]ll\s+"), "will "),
    (re.compile(r"^[Ii]\s+"), ""),
)
_CLAUSE = re.compile(r"(?<=[,;:])\s+|\s+(?=(?:and|but|so|because|which)\s)")
_LINK = re.compile(r"^(?:and|but|so|because|which)\s+")  # what joined a clause on
_WORD = re.compile(r"[\w'’-]+")
_POSSESSIVE = re.compile(r"['’]s$")
_PREFIX = re.compile(r"^[^:]{1,80}:\s+")  # "8 May 2023, Ana: " of a line this module wrote


# The built-in model as its host's TGI /info names it ("google/gemma-3-270m (GGUF Q4_K_M,
# dequantised)"); the same base model behind another TGI matches too, "-it" does not.
_BUILT_IN = re.compile(r"^google/gemma-3-270m(?![\w-])", re.I)


def auto_mode(model_id: str) -> str:
    """What merge_mode=auto means for the LLM serving `model_id` ("" = unknown)."""
    return "extractive" if _BUILT_IN.match(model_id.strip()) else "llm"


@dataclass(frozen=True)
class _Piece:
    turn: int  # index of its turn among the merged ones
    order: int  # position among the pieces, oldest first
    text: str
    facts: tuple[Fact, ...]
    words: frozenset[str]
    question: bool  # asks rather than tells: kept only for a new fact


@dataclass(frozen=True)
class _Unit:
    text: str
    has_facts: bool
    short: str | None  # only its clauses that hold facts (None: no shorter form)


@dataclass(frozen=True)
class _Line:
    """A line of the summary: its prefix and its units ("8 May 2023, Ana: " + "ran
    ...; Joana came" + "."), what fitting shortens or drops. A sentence of the summary
    not written here (the LLM mode's prose) is one unit without a prefix."""

    prefix: str
    units: tuple[_Unit, ...]

    def render(self, state: Sequence[int]) -> str:
        """`state` per unit: 2 whole, 1 shortened, 0 dropped."""
        texts = [
            u.text if k == 2 else (u.short or u.text)
            for u, k in zip(self.units, state, strict=True)
            if k
        ]
        if not texts:
            return ""
        return f"{self.prefix}{'; '.join(texts)}." if self.prefix else " ".join(texts)


def _unit(text: str, held: Sequence[Fact]) -> _Unit:
    """A unit and its short form: the clauses that hold `held` (its facts), where they
    are fewer than all and hold every one of them."""
    clauses = [_LINK.sub("", c.rstrip(",;: ")) for c in _CLAUSE.split(text) if c.strip()]
    kept = [c for c in clauses if len(facts.missing(held, c)) < len(held)]
    short = ", ".join(kept)
    if not held or len(kept) in (0, len(clauses)) or facts.missing(held, short):
        return _Unit(text, bool(held), None)
    return _Unit(text, True, short)


def content_words(text: str) -> frozenset[str]:
    """Lower-cased words that say something (not function words or chat fillers)."""
    return frozenset(
        w
        for w in (_POSSESSIVE.sub("", m.group(0)).lower() for m in _WORD.finditer(text))
        if len(w) > 2 and w not in _STOP and not w.isdigit()
    )


def _body(sentence: str) -> str:
    """A sentence as a line's piece: openers, a leading "I" and the end mark dropped."""
    text = " ".join(sentence.split())
    text = _OPENER.sub("", text)
    for pattern, replacement in _SUBJECT:
        text, n = pattern.subn(replacement, text, count=1)
        if n:
            break
    return text.rstrip(".!?…; ").strip()


def _pieces_of(text: str) -> list[tuple[str, bool]]:
    """(piece, is a question) of a turn: its sentences, a line break ending one too
    (informal chats skip the full stop), long ones cut into clauses."""
    out: list[tuple[str, bool]] = []
    for line in text.splitlines():
        for sentence in facts.sentences(" ".join(line.split())):
            parts = [sentence]
            if len(sentence.split()) > MAX_WORDS:
                parts = [p for p in _CLAUSE.split(sentence) if p.strip()]
            for part in parts:
                body = _body(part)
                if body:
                    out.append((body, part.rstrip().endswith("?")))
    return out


def _prefix(turn: WindowTurn, to: Sequence[str] = ()) -> str:
    """ "8 May 2023, Ana: ", or "8 May 2023, Ana (to Jo): " when she addressed Jo."""
    date = prompt.day(turn.time_us)
    speaker = " ".join(prompt.label(turn).split())
    if to:
        speaker += f" (to {', '.join(to)})"
    return f"{date}, {speaker}: " if date else f"{speaker}: "


async def merge(
    summary: str,
    turns: Sequence[WindowTurn],
    counter: TokenCounter,
    summary_tokens: int,
) -> MergeOutcome:
    """Merge `turns` (whole exchanges, oldest first) into `summary` without an LLM.
    `kept_llm` reports the facts the extract held before it was fitted to the budget."""
    required = facts.extract_all((t.text, prompt.label(t)) for t in turns)
    old = facts.sentences(summary)
    # Facts of the turns the summary or a kept piece states (a piece's facts are the
    # turn's facts its own text holds, so one check per piece finds them).
    held = {(f.kind, f.key) for f in required} - {
        (f.kind, f.key) for f in facts.missing(required, summary)
    }
    bodies = [_PREFIX.sub("", s, count=1) for s in old]  # a line's prefix is no content
    held_words = [content_words(b) for b in bodies]
    seen = {b.lower().rstrip(".!?") for b in bodies}

    # The people talking: "Thanks, Mel!" names its addressee, and says nothing new.
    speakers = {" ".join(prompt.label(t).lower().split()) for t in turns}

    def telling(fact: Fact) -> bool:
        return fact.kind != "name" or not any(
            fact.key == who or (len(fact.key) >= 3 and who.startswith(fact.key)) for who in speakers
        )

    candidates: list[_Piece] = []
    addressed: dict[int, list[Fact]] = {}  # by turn: the participants it names
    for i, turn in enumerate(turns):
        me = " ".join(prompt.label(turn).lower().split())
        for text, question in _pieces_of(turn.text):
            lost = {(f.kind, f.key) for f in facts.missing(required, text)}
            here = [f for f in required if (f.kind, f.key) not in lost]
            own = tuple(f for f in here if telling(f))
            to = addressed.setdefault(i, [])
            to += [f for f in here if not telling(f) and f not in to and not me.startswith(f.key)]
            words = content_words(text)
            candidates.append(_Piece(i, len(candidates), text, own, words, question))

    # Most salient first, so the sentence stating most facts claims them and a later
    # restatement of them is the one dropped; ties keep the conversation's order.
    ranked = sorted(candidates, key=lambda p: (-len(p.facts), -len(p.words), p.order))
    chosen: list[_Piece] = []
    for piece in ranked:
        if piece.text.lower() in seen:
            continue
        if all((f.kind, f.key) in held for f in piece.facts):
            covered = any(
                piece.words and len(piece.words & w) >= OVERLAP * len(piece.words)
                for w in held_words
            )
            novel = piece.words.difference(*held_words) if held_words else piece.words
            need = 1 if piece.facts else MIN_NOVEL_WORDS
            if piece.question or covered or len(novel) < need:
                continue
        chosen.append(piece)
        seen.add(piece.text.lower())
        held_words.append(piece.words)
        held.update((f.kind, f.key) for f in piece.facts)

    by_turn: dict[int, list[_Piece]] = {}
    for piece in sorted(chosen, key=lambda p: p.order):
        by_turn.setdefault(piece.turn, []).append(piece)
    lines = [_read(sentence, telling) for sentence in old]
    for i, pieces in sorted(by_turn.items()):
        units = tuple(_unit(p.text, p.facts) for p in pieces)
        # Whom the turn addressed goes in its prefix (two tokens, where the sentence
        # that named them said nothing else).
        body = " ".join(p.text for p in pieces)
        names = [f.text for f in addressed.get(i, []) if facts.missing([f], body)]
        lines.append(_Line(_prefix(turns[i], names), units))

    extract = " ".join(line.render([2] * len(line.units)) for line in lines)
    kept_extract = facts.kept_count(required, extract)
    final, tokens = await _fit(lines, summary_tokens, counter)
    if not final and required:
        # Not even the newest line fits: the newest facts alone, as `fit` would list them.
        final, tokens = await fit("", required, [], summary_tokens, counter)
    return MergeOutcome(
        summary=final,
        summary_tokens=tokens,
        facts=len(required),
        kept_llm=kept_extract,
        kept=facts.kept_count(required, final),
        llm_calls=0,
        repaired=False,
        invented_dropped=0,
    )


def _read(sentence: str, telling: Callable[[Fact], bool]) -> _Line:
    """A sentence of the old summary as a line: this module's lines ("<date>, <speaker>:
    a; b.") come apart into their units again; any other sentence is one unit."""
    m = _PREFIX.match(sentence)
    if m is None or not sentence.endswith("."):
        return _Line("", (_unit(sentence, [f for f in facts.extract(sentence) if telling(f)]),))
    parts = [u for u in sentence[m.end() : -1].split("; ") if u.strip()]
    units = tuple(_unit(u, [f for f in facts.extract(u) if telling(f)]) for u in parts)
    return _Line(m.group(0), units) if units else _Line("", (_unit(sentence, []),))


async def _fit(lines: list[_Line], cap: int, counter: TokenCounter) -> tuple[str, int]:
    """The lines that fit `cap` tokens, in three steps, each oldest first: units without
    facts leave (a line's chatter before any fact), then units with facts are cut to
    their clauses that hold them, then they leave too; a line goes with its last unit.
    One count of every prefix and unit plans the cut; the joined text is counted again
    (a join tokenises a little differently) and trimmed on until it fits."""
    units = [(li, ui) for li, line in enumerate(lines) for ui in range(len(line.units))]
    if not units:
        return "", 0
    shorts = [(li, ui) for li, ui in units if lines[li].units[ui].short is not None]
    texts = [line.prefix for line in lines]
    texts += [lines[li].units[ui].text for li, ui in units]
    texts += [lines[li].units[ui].short or "" for li, ui in shorts]
    counted = iter(await counter.count(texts))
    prefix_size = [next(counted) for _ in lines]
    size = {(u, 2): next(counted) for u in units} | {(u, 1): next(counted) for u in shorts}
    plain = [u for u in units if not lines[u[0]].units[u[1]].has_facts]
    factual = [u for u in units if lines[u[0]].units[u[1]].has_facts]
    steps = [(u, 0) for u in plain] + [(u, 1) for u in factual if u in shorts]
    steps += [(u, 0) for u in factual]
    state = [[2] * len(line.units) for line in lines]

    def estimate() -> int:
        total = 0
        for li in range(len(lines)):
            live = [ui for ui, k in enumerate(state[li]) if k]
            if live:
                # The "; " between units and the closing "." are left out: the count
                # of the joined text below finds what they add.
                total += prefix_size[li]
                total += sum(size[((li, ui), state[li][ui])] for ui in live)
        return total

    queue = list(steps)
    while queue and estimate() > cap:
        (li, ui), k = queue.pop(0)
        state[li][ui] = min(state[li][ui], k)
    while True:
        rendered = (line.render(k) for line, k in zip(lines, state, strict=True))
        text = " ".join(t for t in rendered if t)
        if not text:
            return "", 0
        n = (await counter.count([text]))[0]
        if n <= cap:
            return text, n
        (li, ui), k = queue.pop(0)
        state[li][ui] = min(state[li][ui], k)
