"""Informal, typo-laden rewrites of benchmark questions, by rule (deterministic per seed).

Real users do not ask "What activities does Melanie partake in?"; they type "wat stuff
does melanie do" on a phone. The rules here are general (nothing is specific to one data
set): lower case, no final punctuation, chat spellings of common words ("you" -> "u",
"what" -> "wat"), dropped apostrophes, filler openers ("hey", "so"), and one keyboard typo
(a dropped, doubled or swapped letter, or a neighbouring key) in about every other long
word. Names keep their letters but lose their capitals, as people type them.

    from informal import informal
    informal("What did Caroline research?", seed=3)  # -> 'hey wat did caroline reserch'
"""

from __future__ import annotations

import random
import re

CHAT = {
    "you": "u",
    "your": "ur",
    "you're": "ur",
    "are": "r",
    "what": "wat",
    "what's": "whats",
    "why": "y",
    "okay": "ok",
    "because": "cuz",
    "please": "pls",
    "people": "ppl",
    "really": "rly",
    "with": "w",
    "about": "abt",
    "tonight": "tonite",
    "though": "tho",
    "going to": "gonna",
    "want to": "wanna",
    "do not": "dont",
    "does not": "doesnt",
    "did not": "didnt",
    "is not": "isnt",
}
OPENERS = ("", "", "", "hey ", "so ", "um ", "quick q: ", "remind me ")
# Neighbouring keys on a QWERTY keyboard (the common slip of a thumb).
KEYS = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]
_NEAR: dict[str, str] = {}
for row in KEYS:
    for i, c in enumerate(row):
        near = row[max(0, i - 1) : i] + row[i + 1 : i + 2]
        _NEAR[c] = near
_WORD = re.compile(r"[a-z]+")


def typo(word: str, rng: random.Random) -> str:
    """One keyboard slip in a word of 5+ letters (first letter kept: people see it)."""
    if len(word) < 5 or not word.isalpha():
        return word
    i = rng.randrange(1, len(word) - 1)
    kind = rng.randrange(4)
    if kind == 0:  # dropped letter
        return word[:i] + word[i + 1 :]
    if kind == 1:  # doubled letter
        return word[:i] + word[i] + word[i:]
    if kind == 2:  # swapped neighbours
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    near = _NEAR.get(word[i], "")
    return word[:i] + (rng.choice(near) if near else word[i]) + word[i + 1 :]


def informal(question: str, seed: int = 0, typo_rate: float = 0.5, opener: bool = True) -> str:
    rng = random.Random(f"{seed}:{question}")
    text = question.strip().lower().rstrip("?.!").replace("\u2019", "'")
    for phrase, short in sorted(CHAT.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"\b{re.escape(phrase)}\b", short, text)
    text = text.replace("'", "")
    words = [
        typo(w, rng) if _WORD.fullmatch(w) and rng.random() < typo_rate else w for w in text.split()
    ]
    return (rng.choice(OPENERS) if opener else "") + " ".join(words)
