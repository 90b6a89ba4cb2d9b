"""Typing slips repaired in a Recall query before it is searched.

People type "wat is carolines relatioonship status". BM25 has its own typo repair
against the words the user's turns hold (the retrieval service's), but the embedder
sees the slip: MiniLM cuts "relatioonship" into word pieces that mean little, and on
typo-laden questions semantic recall fell from R@10 47.9 to 39.0 (docs/recall.md).

The repair is Norvig's: a word of 4 to 20 letters that a frequency list of the language
does not hold, in any of its usual inflections, becomes the most frequent listed word
one edit away (a letter dropped, added or replaced, two neighbours swapped); a word
with no such neighbour stays as typed. Known words are never changed, so a clean query is
searched as it was. Only a blank-separated token that is one plain a-z word (sentence
punctuation around it allowed) is looked at: `18th`, `hadn't`, `café`, `src/app/utlis.py`
and `handleSubmit(` stay as typed, and so do camelCase words and acronyms (`fooBar`,
`LGBTQ`) and capitalised words inside a sentence ("Gina", "Ojai"): names are the words a
list knows least. At most MAX_REPAIRS unknown words are looked at per query, so a query
of noise costs a few milliseconds, not a hundred. The list is one language's; a
deployment whose users write another turns the repair off (HIPPO_GATEWAY_QUERY_SPELLING,
which also says whether BM25 searches the repaired words or the typed ones).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hippo_core.typos import one_edit

MIN_LETTERS = 4  # "wat", "abt", "pls": short chat words are meant, not slips
MAX_LETTERS = 20  # longer "words" are identifiers or noise, not slips
# Unknown words looked at per query: a repair costs ~0.1-0.3 ms of the gateway's event
# loop, and a 4 KiB query of noise would otherwise hold it for ~70 ms.
MAX_REPAIRS = 12
CACHE_SIZE = 8192  # words; repairs repeat (names, common slips)
# A word outside the list may be an inflection of one inside it ("hoodies" when only
# "hoodie" is listed would otherwise become "goodies").
SUFFIXES = (
    ("ies", "y"),
    ("es", ""),
    ("s", ""),
    ("ed", ""),
    ("ed", "e"),
    ("ing", ""),
    ("ing", "e"),
    ("er", ""),
    ("ly", ""),
)
# A blank-separated token that is one plain word, with sentence punctuation around it.
# Anything else (`src/app/utlis.py`, `handleSubmit(`, `hadn't`, `18th`, `café`) is not a
# word a list can judge, and BM25 matches identifiers by their exact form.
_TOKEN = re.compile(r"\S+")
_PLAIN = re.compile(r"([\"'(\[]*)([A-Za-z]+)([\"')\],.!?;:]*)")
SENTENCE_ENDS = ".!?:"


class QuerySpeller:
    """`correct(text)`: the text with each slip replaced (see the module docstring)."""

    def __init__(self, frequencies: Mapping[str, int], min_letters: int = MIN_LETTERS) -> None:
        self._freq = frequencies
        self._min = min_letters
        self._cache: dict[str, str] = {}

    def known(self, word: str) -> bool:
        """`word` (lower case) or the stem of one of its usual inflections is listed."""
        if word in self._freq:
            return True
        return any(
            word.endswith(suffix) and word[: len(word) - len(suffix)] + stem in self._freq
            for suffix, stem in SUFFIXES
            if len(word) - len(suffix) >= 3
        )

    def _settled(self, word: str) -> str | None:
        """`word`'s repair (lower case) when no search is needed: the cached one, or `word`
        itself when it is known or not 4-20 letters long; None when a search must find it."""
        found = self._cache.get(word)
        if found is None and (not self._min <= len(word) <= MAX_LETTERS or self.known(word)):
            found = word
        return found

    def _search(self, word: str) -> str:
        """The listed word one edit from `word` with the highest count, or `word` itself
        when none is listed; cached."""
        # Ties (equal counts) break alphabetically, so a repair never depends on set order.
        counted = [(self._freq[w], w) for w in one_edit(word) if w in self._freq]
        found = min(counted, key=lambda c: (-c[0], c[1]))[1] if counted else word
        if len(self._cache) >= CACHE_SIZE:
            self._cache.clear()
        self._cache[word] = found
        return found

    def correct(self, text: str) -> str:
        return self.spell(text)[0]

    def spell(self, text: str) -> tuple[str, dict[str, str]]:
        """The text with each slip replaced, and the repairs made (the typed word, lower
        case -> its repair, lower case)."""
        budget = MAX_REPAIRS
        sentence_start = True
        repairs: dict[str, str] = {}

        def one(match: re.Match[str]) -> str:
            nonlocal budget, sentence_start
            token = match.group(0)
            starts, sentence_start = sentence_start, token[-1] in SENTENCE_ENDS
            plain = _PLAIN.fullmatch(token)
            if plain is None:
                return token
            before, word, after = plain.groups()
            if any(c.isupper() for c in word[1:]):
                return token  # camelCase or an acronym: an identifier, as typed
            if word[0].isupper() and not starts:
                return token  # capitalised inside a sentence: a name, as typed
            lower = word.lower()
            repaired = self._settled(lower)
            if repaired is None:
                if budget == 0:
                    return token
                budget -= 1
                repaired = self._search(lower)
            if repaired == lower:
                return token
            repairs[lower] = repaired
            return before + (repaired.capitalize() if word[0].isupper() else repaired) + after

        return _TOKEN.sub(one, text), repairs
