"""The merge prompt, and what is done to the LLM's answer before it is checked.

The default LLM is Gemma 3 270M *base*: it continues text, it does not follow
instructions. So the prompt is a document the right answer would continue: a one-line
description, two worked examples, then the case at hand ending in "Note:". The examples
use names, numbers and an identifier that conversations are unlikely to hold (Ana,
Feedzai, KX-4471...) so that a model copying them is caught by the invented-fact check.
An instruction-tuned model behind a real TGI server reads the same prompt as a clear
few-shot task.

Two styles (setting `merge_style`):
- rewrite (default): the note restates the old summary and adds the new lines (the
  examples show this); the answer replaces the summary, so a capable model can compress.
- extend: the note retells only the new lines and is pre-filled with the first new
  speaker's name; the summary is the old one plus the note (the oldest sentences leave
  when it outgrows its budget).
On the local 270M base model both keep the same facts (bench/summary_merge.py); extend
makes it ramble on after the anchor (2x slower merges, 4x more invented sentences).

The stricter prompt (the retry after validation found facts missing) adds a "Must
mention:" line listing them, in the examples too, so even a base model sees the pattern.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hippo_core.neutralise import Neutraliser
from hippo_core.utc import utc
from hippo_summariser.domain.facts import REPAIR, sentences
from hippo_summariser.domain.models import Role, WindowTurn

INTRO = (
    "Each note rewrites the running summary of a chat so that it also covers the new lines. "
    "A note is plain prose in the third person, one paragraph with no lists, headings or "
    "JSON, and keeps every name, number and date."
)
INTRO_EXTEND = (
    "Each note retells the new lines of a chat, which continue the running summary. A note "
    "is plain prose in the third person, one paragraph with no lists, headings or JSON, "
    "and keeps every name, number and date."
)
NO_SUMMARY = "none yet."
# Generation stops at the end of the note's line; the rest guard against a model that
# runs on into a new example.
STOP = ("\n", "<end_of_turn>", "Summary:", "New lines")
_LABEL = {Role.USER: "User", Role.ASSISTANT: "Assistant", Role.SYSTEM: "System", Role.TOOL: "Tool"}
# Gemma's control tokens, stripped from the model's answers. Stored text in a prompt is
# neutralised against the serving model's whole list (`build`); this short list is the
# default until that list is known.
_CONTROL = re.compile(r"</?(?:start_of_turn|end_of_turn|bos|eos|pad|unk|mask)>", re.I)
GEMMA = Neutraliser(
    ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>", "<mask>"]
)
Neutralise = Callable[[str], str]


@dataclass(frozen=True)
class _Example:
    summary: str
    date: str
    lines: tuple[str, ...]
    must: str
    note: str


# Notes retell the new lines in reported speech ("Ana said she..."): a small base model
# follows that pattern line by line without inventing much (measured: docs/sessions.md),
# and it keeps who said what. `note` covers the new lines only; a rewrite's note is the
# old summary followed by it.
EXAMPLES = (
    _Example(
        summary=NO_SUMMARY,
        date="12 March 2021",
        lines=(
            "Ana: I moved to Lisbon last year for a job at Feedzai.",
            "Bot: How do you like it there?",
            "Ana: I love it. My sister Joana visits every 2 months.",
        ),
        must="Lisbon, Feedzai, Joana, 2 months",
        note="Ana said she moved to Lisbon last year for a job at Feedzai. Bot asked how she "
        "likes it. Ana said she loves it and her sister Joana visits every 2 months.",
    ),
    _Example(
        summary="Ana said she moved to Lisbon last year for a job at Feedzai.",
        date="3 June 2022",
        lines=(
            "Tom: Pixel got sick, the vet bill was $240.",
            "Ana: Oh no, is Pixel better now?",
            "Tom: Yes! And I booked a pottery class on Thursdays, order KX-4471.",
        ),
        must="$240, Thursdays, KX-4471",
        note="Tom said his cat Pixel got sick and the vet bill was $240. Ana asked if Pixel "
        "is better now. Tom said yes, and that he booked a pottery class on Thursdays (order "
        "KX-4471).",
    ),
)


def label(turn: WindowTurn) -> str:
    return turn.speaker.strip() or _LABEL[turn.role]


def day(time_us: int) -> str:
    """'8 May 2023' (UTC); empty for an unknown time."""
    if time_us <= 0:
        return ""
    when = utc(time_us)
    return f"{when.day} {when:%B %Y}"


def _line(turn: WindowTurn, max_chars: int, neutralise: Neutralise) -> str:
    text = " ".join(turn.text.split())  # one line per turn: the format is line-based
    if len(text) > max_chars:
        text = text[: max(1, max_chars - 1)].rstrip() + "…"
    speaker = " ".join(label(turn).split())
    return f"{neutralise(speaker)}: {neutralise(text)}"


def _blocks(turns: Sequence[WindowTurn], max_chars: int, neutralise: Neutralise) -> list[str]:
    """'New lines (8 May 2023):' headers, one per run of turns on the same day."""
    out: list[str] = []
    current: str | None = None
    for turn in turns:
        date = day(turn.time_us)
        if date != current:
            out.append(f"New lines ({date}):" if date else "New lines:")
            current = date
        out.append(_line(turn, max_chars, neutralise))
    return out


def _case(summary: str, lines: Sequence[str], must: str | None, note: str | None) -> list[str]:
    out = [f"Summary: {summary or NO_SUMMARY}", *lines]
    if must is not None:
        out.append(f"Must mention: {must}.")
    out.append("Note:" if note is None else f"Note: {note}")
    return out


def build(
    summary: str,
    turns: Sequence[WindowTurn],
    *,
    must: Sequence[str] = (),
    style: str = "rewrite",
    max_chars_per_turn: int = 2000,
    neutralise: Neutralise = GEMMA.neutralise,
) -> tuple[str, str]:
    """(prompt, prefill): the prompt ends with "Note:" plus the prefill, which the caller
    puts in front of the model's continuation (extend style; empty for rewrite).
    `neutralise` breaks the serving model's control-token strings in every stored text
    (turns, speakers, the summary, the facts listed): the prompt is sent as one string,
    and a turn saying "<start_of_turn>" would otherwise be read as one."""
    strict = bool(must)
    parts = [INTRO if style == "rewrite" else INTRO_EXTEND, ""]
    for ex in EXAMPLES:
        lines = [f"New lines ({ex.date}):", *ex.lines]
        note = ex.note
        if style == "rewrite" and ex.summary != NO_SUMMARY:
            note = f"{ex.summary} {ex.note}"
        parts += _case(ex.summary, lines, ex.must if strict else None, note)
        parts.append("")
    listed = neutralise(", ".join(must)) if strict else None
    parts += _case(
        neutralise(summary), _blocks(turns, max_chars_per_turn, neutralise), listed, None
    )
    prompt = "\n".join(parts)
    prefill = ""
    if style == "extend" and turns:
        # Starting the note with the first new speaker's name steers a base model to
        # retell the new lines rather than copy the summary above them.
        prefill = label(turns[0])
        prompt += " " + neutralise(prefill)
    return prompt, prefill


def clean(text: str, *, cut_by_length: bool) -> str:
    """The LLM's answer as one plain-prose paragraph: cut at the first line break or
    stop marker, control tokens, markdown (bullets, numbering, headings, emphasis) and
    JSON wrapping removed, a sentence repeated word for word kept once (small models
    loop), comma lists and copies of the repair sentence dropped (not prose), and an
    unfinished last sentence dropped when generation hit its length cap."""
    text = _CONTROL.sub(" ", text).lstrip()
    text = text.split("\n", 1)[0]
    for marker in STOP[2:]:
        text = text.split(marker, 1)[0]
    text = _unjson(text.strip())
    text = re.sub(r"^\s*(?:#{1,6}|[-*•>]|\d+[.)])(?:\s+|$)", "", text)
    text = re.sub(r"\*\*|__|`", "", text)
    text = re.sub(r"^(?:Note|Summary)\s*:\s*", "", text, flags=re.I)
    seen: set[str] = set()
    kept: list[str] = []
    for sentence in sentences(" ".join(text.split())):
        norm = sentence.lower()
        if (
            norm not in seen
            and re.search(r"\w", sentence)
            and not _is_list(sentence)
            and not norm.startswith(REPAIR)
        ):
            seen.add(norm)
            kept.append(sentence)
    if cut_by_length and kept and not re.search(r"[.!?)\"']$", kept[-1]):
        kept.pop()
    return " ".join(kept)


def _is_list(sentence: str) -> bool:
    """A comma list of names or words ("Mel, Caroline, LGBTQ."): what a small model writes
    when it copies the stricter prompt's "Must mention:" line. Not prose."""
    items = [i.strip() for i in re.split(r",|\band\b", sentence.rstrip(".!?")) if i.strip()]
    return len(items) >= 3 and sum(len(i.split()) <= 2 for i in items) >= 0.75 * len(items)


def _unjson(text: str) -> str:
    if not text.startswith(("{", "[")):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text.strip("{}[] ")
    strings: list[str] = []

    def walk(v: object) -> None:
        if isinstance(v, str):
            strings.append(v.strip())
        elif isinstance(v, dict):
            for item in v.values():
                walk(item)
        elif isinstance(v, list):
            for item in v:
                walk(item)

    walk(value)
    return " ".join(s if s.endswith((".", "!", "?")) else s + "." for s in strings if s)
