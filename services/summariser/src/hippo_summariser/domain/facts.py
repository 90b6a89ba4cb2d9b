"""The facts a summary must keep, and the checks on what the LLM wrote (pure functions).

A rolling summary is only worth its tokens if the details a later question needs survive
it: names, numbers, quantities, dates, times and identifiers. These are found with
patterns (no model), so the check costs microseconds, is deterministic, and cannot be
talked out of by the text it reads. Matching is deliberately forgiving about form
("3,000" = "3000", "three kids" = "3 kids", "8 May, 2023" = "May 8 2023") and strict about
content (the same digits, the same month and day, the same name).

The same patterns guard the other way: a sentence of the LLM's answer that states a name,
number, date or identifier that none of its sources holds was invented (a small base
model copies its few-shot examples) and is removed before the summary is checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MONTHS = {
    name: i + 1
    for i, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ]
    )
    for name in names
}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
NUMBER_WORDS = {
    "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
    "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
    "ninety": 90, "hundred": 100, "thousand": 1000, "million": 1_000_000, "dozen": 12,
}  # fmt: skip
# Capitalised words a summary may start a sentence with without naming anything; they are
# never taken for invented names. (Names in the sources are found by other rules.)
COMMON = frozenset((
    "a", "about", "after", "again", "all", "also", "an", "and", "another", "any", "as", "at",
    "back", "because", "before", "both", "but", "by", "during", "each", "earlier", "either",
    "every", "finally", "first", "for", "from", "he", "her", "here", "hers", "him", "his",
    "however", "i", "i'd", "i'll", "i'm", "i've", "if", "in", "it", "it's", "its", "later",
    "like", "many", "meanwhile", "more", "most", "my", "neither", "next", "no", "not", "now",
    "of", "on", "once", "one", "only", "or", "other", "our", "overall", "she", "since", "so",
    "some", "soon", "still", "such", "than", "that", "the", "their", "them", "then", "there",
    "these", "they", "this", "those", "though", "through", "to", "today", "together",
    "tomorrow", "too", "two", "under", "until", "up", "we", "what", "when", "where", "whether",
    "which", "while", "who", "whose", "why", "with", "within", "without", "yesterday", "yet",
    "you", "your", "recently", "afterwards", "besides", "instead", "otherwise", "none", "user",
    "assistant", "system", "tool",
    # chat words that open sentences and get capitalised mid-sentence after a quote or dash
    "hey", "hi", "hello", "oh", "wow", "yeah", "yes", "yep", "yup", "no", "nope", "ok", "okay",
    "thanks", "thank", "sure", "cool", "great", "awesome", "nice", "good", "glad", "sorry",
    "congrats", "sounds", "lol", "haha", "omg", "btw", "fyi", "tbh", "imo", "idk", "aww",
    "ugh", "hmm", "please", "bye", "love", "well", "just", "really", "totally", "definitely",
))  # fmt: skip
# Words that may follow a number as its unit without being one ("3 of them").
_NOT_UNIT = COMMON | {"am", "pm", "is", "are", "was", "were", "be", "or", "and"}

# Month names only when capitalised: lower-case "may" is nearly always the verb.
_MONTH = r"(?:" + "|".join(sorted((n.capitalize() for n in MONTHS), key=len, reverse=True)) + r")"
_ORD = r"(?:st|nd|rd|th)?"
_DATE_PATTERNS = (
    # 8 May 2023, 8th of May, 2023, 8 May
    re.compile(rf"\b(?P<d>\d{{1,2}}){_ORD}(?:\s+of)?\s+(?P<m>{_MONTH})(?:,?\s+(?P<y>\d{{4}}))?\b"),
    # May 8, 2023; May 8th
    re.compile(rf"\b(?P<m>{_MONTH})\s+(?P<d>\d{{1,2}}){_ORD}(?:,?\s+(?P<y>\d{{4}}))?\b"),
    # May 2023
    re.compile(rf"\b(?P<m>{_MONTH})\s+(?P<y>\d{{4}})\b"),
    # 2023-05-08
    re.compile(r"\b(?P<y>\d{4})-(?P<mn>\d{1,2})-(?P<d>\d{1,2})\b"),
    # in March, since June (a bare month name after a preposition)
    re.compile(
        r"\b(?i:in|since|until|till|by|during|last|next|this|early|late|mid|of)\s+"
        rf"(?P<m>{_MONTH})(?![\w-])"
    ),
)
_WEEKDAY = re.compile(r"\b(?:" + "|".join(WEEKDAYS) + r")s?\b", re.I)
_TIME = re.compile(
    r"\b(?P<h>\d{1,2})(?::(?P<min>\d{2}))?\s*(?P<ap>[ap])\.?m\.?(?![a-z])"
    r"|\b(?P<h2>\d{1,2}):(?P<min2>\d{2})\b",
    re.I,
)
_URL = re.compile(r"\bhttps?://[^\s<>\"')\]]+", re.I)
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
# A token holding both a letter and a digit (KX-4471, v2.3, COVID-19, A12), or snake_case.
_IDENT = re.compile(
    r"\b(?=[\w.-]*\d)(?=[\w.-]*[A-Za-z])[A-Za-z0-9][\w.-]*[A-Za-z0-9]\b"
    r"|\b[a-z0-9]+(?:_[a-z0-9]+)+\b"
)
# Tokens _IDENT finds that are numbers with a unit or suffix: 2nd, 5k, 1990s, 3-night.
_NUMBERISH = re.compile(r"(?P<n>\d+(?:\.\d+)?)(?:st|nd|rd|th|k|s|-[a-z][a-z-]*)", re.I)
_NUMBER = re.compile(
    r"(?<![\w.])(?P<cur>[$€£])?(?P<n>\d+(?:,\d{3})*(?:\.\d+)?)(?P<suf>%|k\b)?"
    r"(?:\s+(?P<unit>(?-i:[a-z][a-z-]{1,20})))?",
    re.I,
)
_NUMBER_WORD = re.compile(
    r"\b(?P<w>" + "|".join(NUMBER_WORDS) + r")\b(?:\s+(?P<unit>(?-i:[a-z][a-z-]{1,20})))?",
    re.I,
)
_CAPITAL = re.compile(r"\b[A-Z][\w'’-]*")
_WORD = re.compile(r"[\w'’-]+")
_BREAK = frozenset('.!?:;"“”()')


REPAIR_PREFIX = "Also mentioned: "
REPAIR = REPAIR_PREFIX.strip().lower()  # how a repair sentence starts (clean() drops copies)


@dataclass(frozen=True)
class Fact:
    kind: str  # "name" | "number" | "date" | "time" | "identifier"
    text: str  # as written (with its unit, for a number): what a repair sentence shows
    key: str  # normalised form that matching compares
    speaker: str = ""  # who said it ("" for facts of a previous summary)


def _possessive(word: str) -> str:
    return re.sub(r"['’]s$", "", word)


def _date_key(m: re.Match[str]) -> str:
    groups = m.groupdict()
    month = int(groups["mn"]) if groups.get("mn") else MONTHS[groups["m"].lower().rstrip(".")]
    return f"{groups.get('y') or ''}-{month}-{int(groups['d']) if groups.get('d') else ''}"


def _time_key(m: re.Match[str]) -> str:
    hour = int(m.group("h") or m.group("h2"))
    minute = int(m.group("min") or m.group("min2") or 0)
    if (m.group("ap") or "").lower() == "p" and hour < 12:
        hour += 12
    if (m.group("ap") or "").lower() == "a" and hour == 12:
        hour = 0
    return f"{hour}:{minute:02d}"


def _number_key(raw: str) -> str:
    value = raw.replace(",", "")
    return value.rstrip("0").rstrip(".") if "." in value else str(int(value))


class _Masked:
    """The text with found spans blanked, so one span is never two facts."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._chars = list(text)

    def take(self, m: re.Match[str]) -> None:
        for i in range(m.start(), m.end()):
            self._chars[i] = " "

    def rest(self) -> str:
        return "".join(self._chars)


def _sentence_initial(text: str, start: int) -> bool:
    """True if nothing but spaces separates `start` from the text's start, a line break or
    a sentence-ending mark (a loop, not a regex over the prefix: texts are up to 32 KiB)."""
    i = start - 1
    while i >= 0 and text[i].isspace():
        if text[i] == "\n":
            return True
        i -= 1
    return i < 0 or text[i] in _BREAK


def extract(text: str, speaker: str = "") -> list[Fact]:
    """The facts in `text`, each once (by kind and key)."""
    facts: list[Fact] = []
    masked = _Masked(text)
    for pattern in (_URL, _EMAIL):
        for m in pattern.finditer(masked.rest()):
            found = m.group(0).rstrip(".,;:!?")  # the sentence's punctuation, not the URL's
            facts.append(Fact("identifier", found, found.lower(), speaker))
            masked.take(m)
    for pattern in _DATE_PATTERNS:
        for m in pattern.finditer(masked.rest()):
            # A bare month is shown without the preposition that found it ("in March").
            parts = m.groupdict()
            shown = m.group(0) if parts.get("d") or parts.get("y") else parts["m"]
            shown = shown.replace(",", "")  # a repair sentence lists facts with commas
            facts.append(Fact("date", shown.strip(), _date_key(m), speaker))
            masked.take(m)
    for m in _WEEKDAY.finditer(masked.rest()):
        day = m.group(0).lower().rstrip("s")
        facts.append(Fact("date", m.group(0), day, speaker))
        masked.take(m)
    for m in _TIME.finditer(masked.rest()):
        facts.append(Fact("time", m.group(0).strip().rstrip("."), _time_key(m), speaker))
        masked.take(m)
    for m in _IDENT.finditer(masked.rest()):
        token = m.group(0)
        numberish = _NUMBERISH.fullmatch(token)
        if numberish:
            facts.append(Fact("number", token, _number_key(numberish.group("n")), speaker))
        else:
            facts.append(Fact("identifier", token, token.lower(), speaker))
        masked.take(m)
    for m in _NUMBER.finditer(masked.rest()):
        shown = (m.group("cur") or "") + m.group("n") + (m.group("suf") or "")
        unit = m.group("unit")
        if unit and unit not in _NOT_UNIT:
            shown += f" {unit}"
        facts.append(Fact("number", shown, _number_key(m.group("n")), speaker))
        masked.take(m)
    for m in _NUMBER_WORD.finditer(masked.rest()):
        unit = m.group("unit")
        shown = m.group(0) if unit and unit not in _NOT_UNIT else m.group("w")
        facts.append(Fact("number", shown, str(NUMBER_WORDS[m.group("w").lower()]), speaker))
        masked.take(m)
    facts.extend(_names(masked.rest(), speaker))
    out: dict[tuple[str, str], Fact] = {}
    for fact in facts:
        out.setdefault((fact.kind, fact.key), fact)
    return list(out.values())


def _names(text: str, speaker: str) -> list[Fact]:
    """Runs of capitalised words. A sentence-initial word counts only if the same word
    also appears capitalised mid-sentence ("Hey Mel" makes "Mel. ..." a name; "Wow" at
    the start of a sentence is just a word). Month and weekday names are dates."""
    found = [(m.start(), m.end(), m.group(0)) for m in _CAPITAL.finditer(text)]
    mid_sentence = {_possessive(w).lower() for s, _, w in found if not _sentence_initial(text, s)}
    runs: list[list[str]] = []
    last_end = -2
    for start, end, word in found:
        bare = _possessive(word)
        lower = bare.lower()
        skip = (
            lower in COMMON
            or lower.rstrip(".") in MONTHS
            or lower.rstrip("s") in WEEKDAYS
            or (_sentence_initial(text, start) and lower not in mid_sentence and not bare.isupper())
            or len(bare) < 2
        )
        if skip:
            last_end = -2
            continue
        if runs and text[last_end:start] == " ":
            runs[-1].append(bare)
        else:
            runs.append([bare])
        last_end = end if bare == word else -2  # "Mel's Cafe" is not one name
    return [Fact("name", " ".join(r), " ".join(r).lower(), speaker) for r in runs]


def extract_all(texts: Iterable[tuple[str, str]]) -> list[Fact]:
    """Facts of several (text, speaker) pairs, each key once (first speaker wins)."""
    out: dict[tuple[str, str], Fact] = {}
    for text, speaker in texts:
        for fact in extract(text, speaker):
            out.setdefault((fact.kind, fact.key), fact)
    return list(out.values())


@dataclass(frozen=True)
class Index:
    """What a text holds, in the normalised forms facts are compared with."""

    lower: str
    words: frozenset[str]
    numbers: frozenset[str]
    dates: tuple[str, ...]
    times: frozenset[str]


def _index(text: str) -> Index:
    facts = extract(text)
    numbers = {f.key for f in facts if f.kind == "number"}
    # A date's day and year are numbers too ("in 2021" is matched by "2021-03-12").
    for f in facts:
        if f.kind == "date":
            y, _, rest = f.key.partition("-")
            _, _, d = rest.partition("-")
            numbers.update(x for x in (y, d) if x)
    words = {_possessive(w).lower() for w in _WORD.findall(text)}
    return Index(
        lower=text.lower(),
        words=frozenset(words),
        numbers=frozenset(numbers),
        dates=tuple(f.key for f in facts if f.kind == "date"),
        times=frozenset(f.key for f in facts if f.kind == "time"),
    )


def _date_matches(fact: str, candidates: Sequence[str]) -> bool:
    if "-" not in fact:  # a weekday
        return False
    fy, fm, fd = fact.split("-")
    for c in candidates:
        if "-" not in c:
            continue
        cy, cm, cd = c.split("-")
        if cm == fm and (not fd or cd == fd) and (not fy or cy == fy):
            return True
    return False


def _kept(fact: Fact, index: Index) -> bool:
    if fact.kind == "number":
        return fact.key in index.numbers
    if fact.kind == "time":
        return fact.key in index.times
    if fact.kind == "date":
        if "-" not in fact.key:
            return fact.key in index.words or f"{fact.key}s" in index.words
        return _date_matches(fact.key, index.dates)
    if fact.kind == "identifier":
        return fact.key in index.lower
    return all(part in index.words for part in fact.key.split())


def missing(facts: Sequence[Fact], text: str) -> list[Fact]:
    """The facts `text` does not hold, in order."""
    index = _index(text)
    return [f for f in facts if not _kept(f, index)]


def kept_count(facts: Sequence[Fact], text: str) -> int:
    return len(facts) - len(missing(facts, text))


def sentences(text: str) -> list[str]:
    """Sentences of a prose paragraph (split after . ! ? followed by a space)."""
    parts = re.split(r"(?<=[.!?])\s+(?=\S)", text.strip())
    return [p.strip() for p in parts if p.strip()]


def index(text: str) -> Index:
    """Index the sources once, to check many sentences against them (`invented`)."""
    return _index(text)


def invented(sentence: str, sources: Index) -> bool:
    """True if the sentence states a number, date, time, identifier or mid-sentence
    capitalised word (a name) that the sources — the old summary, the merged turns, their
    speakers and dates — do not hold. Sentence-initial words are not judged: "Congrats"
    or "Later" opening a sentence names nothing."""
    for fact in extract(sentence):
        if fact.kind != "name" and not _kept(fact, sources):
            return True
    for m in _CAPITAL.finditer(sentence):
        word = _possessive(m.group(0)).lower()
        if _sentence_initial(sentence, m.start()) or word in COMMON or word in sources.words:
            continue
        return True
    return False


def facts_sentence(facts: Sequence[Fact]) -> str:
    """One compact sentence listing facts, grouped by who said them:
    'Also mentioned: LGBTQ, 7 May 2023 (Caroline); 3 kids (Melanie); KX-4471.'"""
    if not facts:
        return ""
    groups: dict[str, list[str]] = {}
    for fact in facts:
        groups.setdefault(fact.speaker, []).append(fact.text)
    parts = [
        ", ".join(items) + (f" ({speaker})" if speaker else "") for speaker, items in groups.items()
    ]
    return REPAIR_PREFIX + "; ".join(parts) + "."
