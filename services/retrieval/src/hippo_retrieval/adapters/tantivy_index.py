"""The lexical index: BM25 over turn text with Tantivy (tantivy-py), embedded, on disk.

Schema. `memory_id` (raw string, stored: the only thing a hit reads back), `tenant`,
`user_id`, `session_id`, `role` (raw strings: one untokenized term each, for exact-term
filters), `time_us` (i64, indexed and fast, for range filters), and two analyses of the
turn text, neither stored (the turn store holds the text):

* `text`: prose, stemmed, positions kept (phrase queries later).
* `exact`: identifiers, frequencies only.

The analyses are analysis.py's (shared with the sparse index, so both see the very same
terms); this module registers them on the index.

Both chains are registered on the index as `TextAnalyzer`s under
versioned names, so indexing and querying run the very same analyzer (Tantivy keeps no
custom tokenizer on disk: they are registered on every open; a document added without
them fails loudly, "Error getting tokenizer"). A changed chain must get a new name.

Queries never go through Tantivy's query parser: `parse_query` raises on ordinary text
(`handleSubmit(`, unbalanced quotes, `foo AND`) and `parse_query_lenient` lets text reach
other fields (`user_id:x`) or match everything (`*`). Instead the query text goes through
the fields' own analyzers (`Analysis.query_terms`): every distinct `text` token becomes a
term query on `text`; every identifier token becomes a term query on `exact`, boosted by
EXACT_BOOST. All are
ORed (Should) inside one Must clause; a text with no tokens (`*`, `~`, emoji only)
returns [] without searching. The scope is a second Must clause: term queries on tenant
and user always, session when given, a Should of the roles when given, a range on
time_us when given, a term per metadata filter pair (`meta`, below), all wrapped in a
constant score of 0 so the reported score is the text's BM25 alone. Operators, colons,
quotes and wildcards are therefore only characters the analyzers split on; no text can
widen the scope. 10 KB of distinct words over 100k turns searches in about 70 ms on 2
cores; a short query in 0.2 ms.

Writes. One IndexWriter for the index's lifetime (Tantivy allows one per index; a second
`TantivyIndex` on the same path raises IndexLockedError), guarded by a lock. A written
turn first deletes any document with its memory_id in its tenant (a Must query on both
raw-string terms; `delete_documents_by_term` on u64 fields silently deletes nothing, so
ids are strings here), then adds the document: re-applying changes is idempotent, and a
deletion can only ever remove its own tenant's document. Tantivy orders deletes and adds
by opstamp, so write-then-delete ends deleted and delete-then-write ends written.

applied_seq. tantivy-py has no commit payload, so the seq lives in the index itself: one
meta document (field `meta` = "applied_seq", stored i64 `seq`; it has no tenant or user
terms, so no search can match it) is replaced in the same commit as the changes it
covers. The seq and the documents are therefore durable together, atomically: no sidecar
file, and no crash window where one leads the other. After each commit the reader is
reloaded so searches see it; nothing applied is searchable before `commit()`.

Deleted documents' terms stay in their segments (not searchable) until Tantivy merges
them away; the text itself is never stored here.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tantivy import (
    Document,
    FieldType,
    Index,
    IndexWriter,
    Occur,
    Query,
    Schema,
    SchemaBuilder,
    Searcher,
)

from hippo_core.typos import one_edit
from hippo_retrieval.adapters.analysis import (
    EXACT_BOOST,
    TYPO_MAX_TERMS,
    TYPO_MIN_CHARS,
    TYPO_WEIGHT,
    Analysis,
    QueryTerms,
    clean_text,
)
from hippo_retrieval.domain.models import (
    Candidate,
    Change,
    Deletion,
    Scope,
    StoredTurn,
    metadata_term,
)

MEMORY_ID = "memory_id"
TENANT = "tenant"
USER = "user_id"
SESSION = "session_id"
ROLE = "role"
TIME = "time_us"
TEXT = "text"
EXACT = "exact"
META = "meta"
SEQ = "seq"

APPLIED_SEQ_KEY = "applied_seq"

TEXT_TOKENIZER = "hippo_en_stem_v1"
EXACT_TOKENIZER = "hippo_exact_v1"


class IndexLockedError(RuntimeError):
    """Another IndexWriter (this process or another) already owns the index directory."""


def build_schema() -> Schema:
    sb = SchemaBuilder()
    sb.add_text_field(MEMORY_ID, stored=True, tokenizer_name="raw", index_option="basic")
    for name in (TENANT, USER, SESSION, ROLE):
        sb.add_text_field(name, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field(TIME, indexed=True, fast=True)
    sb.add_text_field(TEXT, tokenizer_name=TEXT_TOKENIZER, index_option="position")
    sb.add_text_field(EXACT, tokenizer_name=EXACT_TOKENIZER, index_option="freq")
    sb.add_text_field(META, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field(SEQ, stored=True)
    return sb.build()


class TantivyIndex:
    """`LexicalIndex` over a Tantivy index in the directory `path` (created if missing)."""

    def __init__(
        self, path: Path, *, writer_heap_bytes: int = 50_000_000, typos: bool = False
    ) -> None:
        self._path = Path(path)
        self._typos = typos
        self._path.mkdir(parents=True, exist_ok=True)
        self._schema = build_schema()
        # Opens the index if one exists (Tantivy refuses a different schema), else creates it.
        self._index = Index(self._schema, path=str(self._path), reuse=True)
        self._analysis = Analysis()
        # Registered before the writer exists, on every open: Tantivy does not persist them.
        self._index.register_tokenizer(TEXT_TOKENIZER, self._analysis.text)
        self._index.register_tokenizer(EXACT_TOKENIZER, self._analysis.exact)
        self._lock = threading.Lock()
        try:
            self._writer: IndexWriter | None = self._index.writer(
                heap_size=writer_heap_bytes, num_threads=0
            )
        except ValueError as exc:
            if "LockBusy" in str(exc):
                raise IndexLockedError(
                    f"lexical index {self._path} is in use by another writer "
                    f"(one TantivyIndex per directory): {exc}"
                ) from exc
            raise
        self._index.reload()
        self._committed_seq = self._read_applied_seq()
        self._pending_seq = self._committed_seq
        self._dirty = False

    # -- writes ------------------------------------------------------------------------

    def apply(self, changes: Sequence[Change]) -> None:
        with self._lock:
            writer = self._require_writer()
            for change in changes:
                self._delete(writer, change.tenant, change.memory_id)
                if isinstance(change, StoredTurn):
                    writer.add_document(self._document(change))
                elif not isinstance(change, Deletion):  # pragma: no cover - typing guard
                    raise TypeError(f"not a change: {change!r}")
                self._pending_seq = max(self._pending_seq, change.seq)
                self._dirty = True

    def commit(self) -> None:
        with self._lock:
            writer = self._require_writer()
            self._commit(writer)

    def writable(self) -> bool:
        return True  # one writer per directory: always this process

    def applied_seq(self) -> int:
        with self._lock:
            return self._committed_seq

    def close(self) -> None:
        with self._lock:
            writer = self._writer
            if writer is None:
                return
            self._commit(writer)
            writer.wait_merging_threads()  # consumes the writer and releases its lock
            self._writer = None

    def __enter__(self) -> TantivyIndex:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- reads -------------------------------------------------------------------------

    def search(
        self,
        scope: Scope,
        query: str,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        if limit <= 0:  # Tantivy panics (PanicException, a BaseException) on limit 0
            return []
        searcher = self._index.searcher()
        terms = self._analysis.query_terms(query, query_repairs)
        text_query = self._text_query(terms, searcher)
        if text_query is None:
            return []
        return self._ranked(searcher, text_query, scope, limit)

    def _ranked(
        self, searcher: Searcher, text_query: Query, scope: Scope, limit: int
    ) -> list[Candidate]:
        """The best `limit` of `text_query` inside `scope`, best first, ties broken alike
        on every replica."""
        full = Query.boolean_query(
            [
                (Occur.Must, text_query),
                (Occur.Must, Query.const_score_query(self._scope_query(scope), 0.0)),
            ]
        )
        limit = min(limit, max(1, searcher.num_docs))
        hits = searcher.search(full, limit).hits
        ranked: list[tuple[float, int, str]] = []
        for score, address in hits:
            doc = searcher.doc(address)
            memory_id, time_us = doc.get_first(MEMORY_ID), doc.get_first(TIME)
            if isinstance(memory_id, str):
                ranked.append(
                    (-float(score), time_us if isinstance(time_us, int) else 0, memory_id)
                )
        # Equal scores come back in index order, which depends on the commit history: the
        # earlier turn first instead (a turn and the next one, whose document quotes it,
        # score alike), then by id, so a replica, a rebuilt index and an imported copy
        # rank them alike.
        ranked.sort()
        out = [Candidate(memory_id=m, score=-negative) for negative, _, m in ranked]
        return out

    # -- internals ---------------------------------------------------------------------

    def _require_writer(self) -> IndexWriter:
        if self._writer is None:
            raise RuntimeError("TantivyIndex is closed")
        return self._writer

    def _document(self, turn: StoredTurn) -> Document:
        text = clean_text(turn.text)
        fields: dict[str, Any] = {
            MEMORY_ID: turn.memory_id,
            TENANT: turn.tenant,
            USER: turn.user,
            SESSION: turn.session,
            ROLE: str(turn.role),
            TIME: turn.time_us,
            TEXT: clean_text(turn.document) if turn.document else text,
            EXACT: text,  # the turn's own words only: identifiers lead to their own turn
        }
        terms = list(turn.filter_terms)
        if terms:
            # Metadata filters: one exact term per pair, in the raw `meta` field the
            # applied_seq document also uses (its one term, "applied_seq", has no "N:"
            # prefix, so no pair can match it, nor it a filter).
            fields[META] = terms
        return Document.from_dict(fields, self._schema)

    def _term(self, field: str, value: str) -> Query:
        return Query.term_query(self._schema, field, value)

    def _delete(self, writer: IndexWriter, tenant: str, memory_id: str) -> None:
        writer.delete_documents_by_query(
            Query.boolean_query(
                [
                    (Occur.Must, self._term(MEMORY_ID, memory_id)),
                    (Occur.Must, self._term(TENANT, tenant)),
                ]
            )
        )

    def _commit(self, writer: IndexWriter) -> None:
        if not self._dirty:
            return
        if self._pending_seq != self._committed_seq:
            # Replace the meta document in the same commit as the changes it covers.
            writer.delete_documents_by_term(META, APPLIED_SEQ_KEY)
            writer.add_document(
                Document.from_dict({META: APPLIED_SEQ_KEY, SEQ: self._pending_seq}, self._schema)
            )
        writer.commit()
        self._index.reload()
        self._committed_seq = self._pending_seq
        self._dirty = False

    def _read_applied_seq(self) -> int:
        searcher = self._index.searcher()
        hits = searcher.search(self._term(META, APPLIED_SEQ_KEY), 10).hits
        seqs = [searcher.doc(address).get_first(SEQ) for _, address in hits]
        return max((int(s) for s in seqs if isinstance(s, int)), default=0)

    def _text_query(self, terms: QueryTerms, searcher: Searcher) -> Query | None:
        clauses: list[tuple[Occur, Query]] = []
        repairs = TYPO_MAX_TERMS if self._typos else 0
        searched: set[str] = set()
        for typed in terms.text:
            token = typed
            if typed in terms.hints and not searcher.doc_freq(TEXT, typed):
                # The caller's repair of a word no turn holds (analysis.QueryTerms.hints).
                hint = terms.hints[typed]
                if hint is None:
                    continue  # a stop word
                if searcher.doc_freq(TEXT, hint):
                    token = hint
            if token in searched:
                continue
            searched.add(token)
            if repairs and len(token) >= TYPO_MIN_CHARS and not searcher.doc_freq(TEXT, token):
                repairs -= 1
                known = [t for t in one_edit(token) if searcher.doc_freq(TEXT, t)]
                if known:
                    repaired = Query.boolean_query(
                        [(Occur.Should, self._term(TEXT, t)) for t in known]
                    )
                    clauses.append((Occur.Should, Query.boost_query(repaired, TYPO_WEIGHT)))
                    continue
            clauses.append((Occur.Should, self._term(TEXT, token)))
        for token in terms.exact:
            clauses.append((Occur.Should, Query.boost_query(self._term(EXACT, token), EXACT_BOOST)))
        if not clauses:
            return None
        return Query.boolean_query(clauses)

    def _scope_query(self, scope: Scope) -> Query:
        clauses: list[tuple[Occur, Query]] = [
            (Occur.Must, self._term(TENANT, scope.tenant)),
            (Occur.Must, self._term(USER, scope.user)),
        ]
        if scope.session is not None:
            clauses.append((Occur.Must, self._term(SESSION, scope.session)))
        if scope.roles:
            roles = sorted(str(role) for role in scope.roles)
            clauses.append(
                (
                    Occur.Must,
                    Query.boolean_query([(Occur.Should, self._term(ROLE, r)) for r in roles]),
                )
            )
        for key, value in scope.metadata:
            clauses.append((Occur.Must, self._term(META, metadata_term(key, value))))
        if scope.start_us is not None or scope.end_us is not None:
            clauses.append(
                (
                    Occur.Must,
                    Query.range_query(
                        self._schema,
                        TIME,
                        FieldType.Integer,
                        lower_bound=scope.start_us,
                        upper_bound=scope.end_us,
                        include_lower=True,
                        include_upper=scope.end_us is None,  # end is exclusive
                    ),
                )
            )
        return Query.boolean_query(clauses)


__all__ = ["IndexLockedError", "TantivyIndex"]
