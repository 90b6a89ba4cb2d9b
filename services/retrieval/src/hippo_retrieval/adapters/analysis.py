"""Text analysis shared by both lexical indexes (Tantivy's, and Qdrant's sparse vectors).

Two analyses of a turn, run by Tantivy's own analyzers (tantivy-py runs them from Python),
so the Tantivy index and the sparse index see the very same terms:

* `text`: prose. Tantivy's simple tokenizer (splits on anything not alphanumeric), drop
  tokens over 40 bytes, lowercase, English Snowball stemmer: the same chain as Tantivy's
  built-in `en_stem`, so "running" finds "runs". The query side also drops English stop
  words (unless that leaves nothing: "who are you?" then searches its stop words).
* `exact`: identifiers. Whitespace-separated runs trimmed to start and end on a letter,
  digit or underscore, then lowercased (tokens over 255 bytes dropped).
  `handleSubmit(` -> `handlesubmit`, `ERR_CONNECTION_REFUSED:` ->
  `err_connection_refused`, `(v2.14.1)` -> `v2.14.1`, `"src/app/main.py"` ->
  `src/app/main.py`. In `text` the same strings fall apart into common pieces (`v2`,
  `14`, `1`; `src`, `app`, `main`, `py`), which match every version number or path; in
  `exact` they stay one rare term. The query side searches `exact` only with the tokens
  that look like identifiers (`looks_like_identifier`), so a filler word in "where is
  handleSubmit defined?" cannot outweigh the identifier.

A caller's spelling repairs (`query_terms(query, repairs)`: typed word -> repair) become
`hints`: the typed word's term -> the repair's term (None when the repair is a stop word).
An index searches a hinted term as typed when some turn holds it, else as its hint: the
user's own words ("destress", a friend's nickname) win over a word list's guess.

Query text is cut to MAX_QUERY_CHARS and MAX_QUERY_TERMS distinct terms per field, so a
pasted log still searches in bounded time. Lone surrogates, which Python strings allow
and Rust strings reject, are replaced before analysis (turn text too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tantivy import Filter, TextAnalyzer, TextAnalyzerBuilder, Tokenizer

from hippo_retrieval.adapters import stopwords

# A query's identifier terms count twice a word's: an identifier the user typed names the
# turn they want far more surely than the words around it.
EXACT_BOOST = 2.0
# Typo repair (`typos=True`): a query term of this many letters or more that no document
# holds is replaced by the terms one edit away that documents do hold, weighted by this
# (a guess counts for less than a word the user typed right).
TYPO_MIN_CHARS = 4
TYPO_WEIGHT = 0.8
TYPO_MAX_TERMS = 16  # unknown query terms repaired per query (a pasted log has many)
MAX_QUERY_CHARS = 32_768
MAX_QUERY_TERMS = 4096  # distinct terms per field

# A token: a whitespace-free run that starts and ends on a letter, digit or underscore
# (leftmost-first, greedy: surrounding punctuation is trimmed, inner punctuation kept).
_EXACT_PATTERN = r"[\p{L}\p{N}_](?:\S*[\p{L}\p{N}_])?"


def text_analyzer(*, stop_words: frozenset[str] = frozenset()) -> TextAnalyzer:
    """The `text` field's chain: Tantivy's `en_stem` (simple, remove_long 40, lowercase,
    English stemmer). With `stop_words` (query side only) they go before stemming."""
    builder = (
        TextAnalyzerBuilder(Tokenizer.simple())
        .filter(Filter.remove_long(40))
        .filter(Filter.lowercase())
    )
    if stop_words:
        builder = builder.filter(Filter.custom_stopword(sorted(stop_words)))
    return builder.filter(Filter.stemmer("english")).build()


def exact_analyzer(*, lowercase: bool = True) -> TextAnalyzer:
    """The `exact` field's chain: punctuation-trimmed whitespace tokens, lowercased.
    Without `lowercase` it keeps the case, which the query side reads to tell
    identifiers from words."""
    builder = TextAnalyzerBuilder(Tokenizer.regex(_EXACT_PATTERN)).filter(Filter.remove_long(255))
    if lowercase:
        builder = builder.filter(Filter.lowercase())
    return builder.build()


def looks_like_identifier(token: str) -> bool:
    """True for tokens that are more than a plain word: inner punctuation or underscore
    (`ERR_CONNECTION_REFUSED`, `v2.14.1`, `src/app/main.py`, `user_id:x`), letters mixed
    with digits (`v2`, `sha256`), or an upper-case letter after the first (`handleSubmit`,
    `NASA`). Plain words and plain numbers are left to the stemmed `text` field."""
    has_letter = any(c.isalpha() for c in token)
    has_digit = any(c.isdigit() for c in token)
    return (
        any(not c.isalnum() for c in token)
        or (has_letter and has_digit)
        or any(c.isupper() for c in token[1:])
    )


def clean_text(text: str) -> str:
    """`text` as valid UTF-8: lone surrogates (which Rust strings reject) become '?'."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def distinct(tokens: Iterable[str], limit: int) -> list[str]:
    """The first `limit` distinct non-empty tokens, in order."""
    seen: dict[str, None] = {}
    for token in tokens:
        if token:
            seen.setdefault(token, None)
            if len(seen) >= limit:
                break
    return list(seen)


@dataclass(frozen=True)
class QueryTerms:
    text: list[str]  # distinct `text` terms, stop words dropped unless that left none
    exact: list[str]  # distinct `exact` terms of the tokens that look like identifiers
    # A `text` term -> the term of the caller's repair of its word (None: a stop word);
    # searched when no turn of the scope holds the term itself (module docstring).
    hints: dict[str, str | None] = field(default_factory=dict)


class Analysis:
    """The analyzers, built once (each build compiles a regex or a stemmer)."""

    def __init__(self) -> None:
        self.text = text_analyzer()
        self.exact = exact_analyzer()
        self._query = text_analyzer(stop_words=stopwords.ENGLISH)
        self._raw_exact = exact_analyzer(lowercase=False)

    def query_terms(self, query: str, repairs: Mapping[str, str] | None = None) -> QueryTerms:
        text = clean_text(query[:MAX_QUERY_CHARS])
        terms = distinct(self._query.analyze(text), MAX_QUERY_TERMS)
        if not terms:  # only stop words ("who are you?"): then they are the query
            terms = distinct(self.text.analyze(text), MAX_QUERY_TERMS)
        identifiers = (
            token
            for raw in self._raw_exact.analyze(text)
            if looks_like_identifier(raw)
            # The index's own analyzer on the raw token: the term exactly as indexed.
            for token in self.exact.analyze(raw)
        )
        return QueryTerms(
            terms, distinct(identifiers, MAX_QUERY_TERMS), self._hints(terms, repairs or {})
        )

    def _hints(self, terms: list[str], repairs: Mapping[str, str]) -> dict[str, str | None]:
        """The query terms of the repaired words -> their repairs' terms (one word is one
        term, or none when it is a stop word; anything else is not a word and is left
        out)."""
        hints: dict[str, str | None] = {}
        wanted = set(terms)
        for typed, repaired in repairs.items():
            typed_terms = self.text.analyze(clean_text(typed))
            if len(typed_terms) != 1 or typed_terms[0] not in wanted:
                continue
            repaired_terms = self._query.analyze(clean_text(repaired))
            if len(repaired_terms) > 1:
                continue
            hint = repaired_terms[0] if repaired_terms else None
            if hint != typed_terms[0]:
                hints[typed_terms[0]] = hint
        return hints
