"""Recall levers measured and left out (issue 19), each against the default in one run.

Recall is measured as `bench/lexical_parity.py --hybrid --arms tantivy` does: the
retrieval service in-process over the dev file (typo repair on, the default fusion), so
the "off" row is the product's default. Turns and questions are embedded once. Each lever
wraps one function for the run; nothing here is a feature.

* `--lever prf`: pseudo-relevance feedback on the BM25 side (RM3-style). After the first
  BM25 pass the top M candidates' documents give T expansion terms (stems weighted by tf
  in the document x idf x the document's BM25 score, the query's own terms left out),
  OR-ed with the original query at total weight W, and BM25 runs again.
  `--grid M values:T values:W values` (default 3,5,10:5,10,20:0.3,0.6,1.0).
* `--lever convex`: a convex combination of the two lists' scores in place of RRF:
  alpha x BM25 + (1 - alpha) x cosine, each normalised over its own candidates (min-max,
  or divided by the list's best: `max`), then the same neighbour and speaker steps.
  `--grid alpha values:normalisations` (default 0.3,0.4,0.5,0.6,0.7:minmax,max).
* `--lever speaker-list`: when the query names one speaker (the speaker step's rule), a
  third list fused beside the two: the query vector's nearest turns among that speaker's
  own (an exact search over the user's turns), at weight W, or in place of the vector
  list (`replace`). `--grid` weights or `replace` (default 0.5,1.0,replace).
* `--lever query-form`: the vector side searched with the question rewritten to look like
  a turn: `prefix` ("Melanie: <question>" when it names one speaker), `strip` (question
  words and auxiliaries dropped, then the prefix), `strip-noname` (dropped, the name
  too). In place of the vector list, or fused beside it (`+`: both at weight 0.5).
  `--grid` forms (default prefix,strip,strip-noname,prefix+,strip+,strip-noname+).
* `--lever speller`: the gateway's query speller (hippo_gateway/domain/spelling.py) on
  the text that is embedded (`vector`), on the text both retrievers get (`both`: BM25
  and the speaker step search the repaired words too), or the question as typed with
  its repairs beside it (`words`, the default: BM25 and the speaker step read a typed
  word that the index holds as typed, else its repair). The "off" row embeds the
  question as typed. `--grid` (default vector,both,words).

    .venv/bin/python bench/recall_levers.py --lever LEVER [--informal SEED] [--grid ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import math
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lexical_parity as lp
import numpy as np
from tantivy import Occur, Query

import hippo_retrieval.adapters.tantivy_index as ti
import hippo_retrieval.domain.fusion as fusion
import hippo_retrieval.domain.retriever as retriever
from hippo_cli import locomo
from hippo_embedding.adapters.onnx_encoder import OnnxEncoder
from hippo_gateway.adapters.word_frequencies import english_word_counts
from hippo_gateway.domain.spelling import QuerySpeller
from hippo_retrieval.adapters.analysis import clean_text
from hippo_retrieval.domain.models import Candidate, FusedHit, Place, Scope
from hippo_retrieval.domain.service import RetrievalService

DOCUMENTS: dict[str, str] = {}  # memory_id -> its BM25 document (the feedback text)
TURNS: list[Any] = []  # the stored turns, in the order their vectors were encoded
VECTORS: list[Any] = []  # [the turns' vectors]: the first batch the encoder made
ENCODER: list[OnnxEncoder] = []
SEARCHED: dict[str, Any] = {}  # the scope and vector of the search being fused
QUERY_TEXT: list[Callable[[str], str]] = []  # what of a question is embedded (speller)


def remember_documents() -> None:
    stored = lp.stored_turns

    def keep(conversations: list[locomo.Conversation]) -> list[Any]:
        turns = stored(conversations)
        DOCUMENTS.update((t.memory_id, t.document) for t in turns)
        TURNS[:] = turns
        return turns

    lp.stored_turns = keep


def embed_once() -> None:
    """The arms differ in BM25 only: the same texts are embedded once."""
    encode = OnnxEncoder.encode
    cache: dict[tuple[str, ...], Any] = {}

    def cached(self: OnnxEncoder, texts: Sequence[str]) -> Any:
        if VECTORS and QUERY_TEXT:  # the questions (the turns come first)
            texts = [QUERY_TEXT[0](t) for t in texts]
        key = tuple(texts)
        if key not in cache:
            cache[key] = encode(self, texts)
        if not VECTORS:  # lexical_parity encodes the turns first
            VECTORS.append(np.asarray(cache[key], dtype=np.float32))
            ENCODER.append(self)
        return cache[key]

    OnnxEncoder.encode = cached  # type: ignore[method-assign, assignment]


def with_feedback(
    search: Callable[..., list[Candidate]], m: int, t: int, w: float
) -> Callable[..., list[Candidate]]:
    def prf(
        self: ti.TantivyIndex,
        scope: Scope,
        query: str,
        limit: int,
        query_repairs: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        first = search(self, scope, query, limit, query_repairs)
        if len(first) < m:
            return first
        searcher = self._index.searcher()
        terms = self._analysis.query_terms(query, query_repairs)
        own = set(terms.text)
        docs = max(1, searcher.num_docs)
        weights: defaultdict[str, float] = defaultdict(float)
        for hit in first[:m]:
            stems = self._analysis.text.analyze(clean_text(DOCUMENTS.get(hit.memory_id, "")))
            for stem, tf in Counter(stems).items():
                if stem in own or len(stem) < 3:
                    continue
                df = searcher.doc_freq(ti.TEXT, stem)
                if df:
                    weights[stem] += tf / len(stems) * math.log(1 + docs / df) * hit.score
        chosen = sorted(weights.items(), key=lambda kv: -kv[1])[:t]
        base = self._text_query(terms, searcher)
        if not chosen or base is None:
            return first
        total = sum(v for _, v in chosen)
        expansion = Query.boolean_query(
            [
                (Occur.Should, Query.boost_query(self._term(ti.TEXT, s), w * v / total))
                for s, v in chosen
            ]
        )
        expanded = Query.boolean_query([(Occur.Should, base), (Occur.Should, expansion)])
        return self._ranked(searcher, expanded, scope, limit)

    return prf


def one_run(args: argparse.Namespace) -> list[str]:
    """The table row of `lexical_parity --hybrid --arms tantivy`: overall and per group."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        asyncio.run(lp.hybrid(locomo.load(args.data), args))
    row = out.getvalue().strip().splitlines()[-1]
    return [c.strip() for c in row.strip("|").split("|")]


def convex(alpha: float, normalise: str) -> Callable[..., list[FusedHit]]:
    """`fusion.fuse` with alpha x BM25 + (1 - alpha) x cosine in place of RRF."""
    rrf = fusion.fuse

    def fuse(lists: Mapping[str, Sequence[Candidate]], **kw: Any) -> list[FusedHit]:
        if len(lists) < 2:  # LEXICAL or SEMANTIC mode: one retriever's own ranking
            return rrf(lists, **kw)
        fused: dict[str, float] = {}
        best: dict[str, int] = {}
        firsts: dict[str, dict[str, tuple[int, float]]] = {}
        for name, candidates in lists.items():
            share = alpha if name == retriever.LEXICAL else 1 - alpha
            first = firsts[name] = {}
            scores = [c.score for c in candidates] or [0.0]
            low = min(scores) if normalise == "minmax" else 0.0
            span = (max(scores) - low) or 1.0
            for position, c in enumerate(candidates, start=1):
                if c.memory_id in first:
                    continue
                first[c.memory_id] = (position, c.score)
                fused[c.memory_id] = fused.get(c.memory_id, 0.0) + share * (c.score - low) / span
                best[c.memory_id] = min(best.get(c.memory_id, position), position)
        return fusion._steps(
            fused, best, firsts, kw["limit"], kw.get("places"), kw.get("neighbour_weight", 0.0),
            kw.get("query", ""), kw.get("speaker_weight", 0.0),
        )  # fmt: skip

    return fuse


def remember_searches() -> None:
    """Each search's scope and query vector, for a fuse that searches again."""
    search = retriever.Retriever.search

    def keep(self: retriever.Retriever, scope: Scope, query: str, vector: Any, *a: Any) -> Any:
        SEARCHED.update(scope=scope, vector=vector)
        return search(self, scope, query, vector, *a)

    retriever.Retriever.search = keep  # type: ignore[method-assign, assignment]


def nearest(vector: Any, speaker: str | None = None, n: int = 100) -> list[Candidate]:
    """An exact vector search over the searched user's turns (one speaker's only)."""
    user = SEARCHED["scope"].user
    rows = [
        i
        for i, t in enumerate(TURNS)
        if t.user == user and (speaker is None or t.metadata.get("speaker") == speaker)
    ]
    scores = VECTORS[0][rows] @ np.asarray(vector, dtype=np.float32)
    order = np.argsort(-scores)[:n]
    return [Candidate(TURNS[rows[o]].memory_id, float(scores[o])) for o in order]


def places_too(places: Callable[[list[str]], Any] | None) -> Callable[[list[str]], Any] | None:
    """Places from the stored turns (as the store numbers them: 1-based, in arrival
    order), for the candidates a new list adds too; None when the search has no steps."""
    if places is None:
        return None
    position: dict[str, Place] = {}
    counted: Counter[tuple[str, str]] = Counter()
    for t in TURNS:
        counted[(t.user, t.session)] += 1
        position[t.memory_id] = Place(
            t.session, counted[(t.user, t.session)], t.metadata.get("speaker", "")
        )
    return lambda ids: {m: position[m] for m in ids if m in position}  # fmt: skip


def speaker_list(setting: str) -> Callable[..., list[FusedHit]]:
    rrf = fusion.fuse

    def fuse(lists: Mapping[str, Sequence[Candidate]], **kw: Any) -> list[FusedHit]:
        places = kw.get("places")
        if len(lists) < 2 or places is None:
            return rrf(lists, **kw)
        ids = list({c.memory_id for cands in lists.values() for c in cands})
        speakers = {p.speaker for p in places(ids).values() if p.speaker}
        speaker = fusion.named_speaker(kw.get("query", ""), speakers)
        if speaker is None:
            return rrf(lists, **kw)
        own = nearest(SEARCHED["vector"], speaker)
        weights = dict(kw["weights"])
        if setting == "replace":
            lists = {**lists, retriever.SEMANTIC: own}
        else:
            lists = {**lists, "speaker": own}
            weights["speaker"] = float(setting)
        return rrf(lists, **{**kw, "weights": weights, "places": places_too(places)})

    return fuse


# fmt: off
QUESTION_WORDS = frozenset((
    "what", "when", "where", "who", "whom", "whose", "which", "why", "how", "does", "do",
    "did", "is", "are", "was", "were", "has", "have", "had", "can", "could", "would",
    "will", "should", "the", "a", "an",
))
# fmt: on


def query_form(form: str) -> Callable[..., list[FusedHit]]:
    rrf = fusion.fuse
    shape, both = form.rstrip("+"), form.endswith("+")

    def fuse(lists: Mapping[str, Sequence[Candidate]], **kw: Any) -> list[FusedHit]:
        places = kw.get("places")
        if len(lists) < 2 or places is None:
            return rrf(lists, **kw)
        query = kw.get("query", "")
        ids = list({c.memory_id for cands in lists.values() for c in cands})
        speaker = fusion.named_speaker(
            query, {p.speaker for p in places(ids).values() if p.speaker}
        )
        names = set(re.findall(r"\w+", (speaker or "").lower()))
        words = re.findall(r"[\w'+-]+", query)
        if shape != "prefix":
            words = [
                w for w in words
                if w.lower() not in QUESTION_WORDS and w.lower().removesuffix("'s") not in names
            ]  # fmt: skip
        text = " ".join(words) if shape != "prefix" else query
        if shape != "strip-noname" and speaker is not None:
            text = f"{speaker}: {text}"
        rewritten = nearest(ENCODER[0].encode([text or query])[0])
        weights = dict(kw["weights"])
        if both:
            lists = {**lists, "rewritten": rewritten}
            weights[retriever.SEMANTIC] = weights["rewritten"] = 0.5 * weights[retriever.SEMANTIC]
        else:
            lists = {**lists, retriever.SEMANTIC: rewritten}
        return rrf(lists, **{**kw, "weights": weights, "places": places_too(places)})

    return fuse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lever",
        choices=("prf", "convex", "speaker-list", "query-form", "speller"),
        required=True,
    )
    parser.add_argument("--data", type=Path, default=lp.DEFAULT_DATA)
    parser.add_argument("--informal", type=int, metavar="SEED")
    parser.add_argument("--grid", help="the lever's settings (see the module docstring)")
    args = parser.parse_args()
    args.arms = "tantivy"
    if args.lever == "speller" and args.grid:
        unknown = set(args.grid.split(",")) - {"vector", "both", "words"}
        if unknown:
            parser.error(f"--lever speller takes vector, both or words, not {sorted(unknown)}")
    remember_documents()
    embed_once()
    remember_searches()
    rows = [("off (the default)", one_run(args))]
    if args.lever == "prf":
        grid = args.grid or "3,5,10:5,10,20:0.3,0.6,1.0"
        ms, ts, ws = ([float(v) for v in part.split(",")] for part in grid.split(":"))
        search = ti.TantivyIndex.search
        for m, t, w in itertools.product(ms, ts, ws):
            ti.TantivyIndex.search = with_feedback(search, int(m), int(t), w)  # type: ignore[method-assign]
            rows.append((f"BM25 feedback M={int(m)} T={int(t)} W={w}", one_run(args)))
            print(f"{rows[-1][0]}: {rows[-1][1][1]}", file=sys.stderr)
        ti.TantivyIndex.search = search  # type: ignore[method-assign]
    elif args.lever in ("speaker-list", "query-form"):
        make: Callable[[str], Callable[..., list[FusedHit]]]
        if args.lever == "speaker-list":
            settings, make, label = (args.grid or "0.5,1.0,replace"), speaker_list, "speaker list"
        else:
            settings = args.grid or "prefix,strip,strip-noname,prefix+,strip+,strip-noname+"
            make, label = query_form, "query form"
        for setting in settings.split(","):
            retriever.fuse = make(setting)  # type: ignore[attr-defined]
            rows.append((f"{label} {setting}", one_run(args)))
            print(f"{rows[-1][0]}: {rows[-1][1][1]}", file=sys.stderr)
        retriever.fuse = fusion.fuse  # type: ignore[attr-defined]
    elif args.lever == "speller":
        speller = QuerySpeller(english_word_counts())
        questions = lp.questions_of

        def repaired(conversations: Any, seed: int | None) -> list[Any]:
            return [(u, q, speller.correct(text)) for u, q, text in questions(conversations, seed)]

        service_search = RetrievalService.search

        async def with_repairs(
            self: RetrievalService, scope: Scope, query: str, vector: Any, mode: Any, top_k: int
        ) -> Any:
            repairs = speller.spell(query)[1]
            return await service_search(
                self, scope, query, vector, mode, top_k, query_repairs=repairs
            )

        for setting in (args.grid or "vector,both,words").split(","):
            QUERY_TEXT[:] = [speller.correct]
            if setting == "both":
                lp.questions_of = repaired
            if setting == "words":
                RetrievalService.search = with_repairs  # type: ignore[method-assign, assignment]
            rows.append((f"query speller, {setting}", one_run(args)))
            print(f"{rows[-1][0]}: {rows[-1][1][1]}", file=sys.stderr)
            lp.questions_of = questions
            RetrievalService.search = service_search  # type: ignore[method-assign]
        QUERY_TEXT.clear()
    else:
        alphas, norms = (args.grid or "0.3,0.4,0.5,0.6,0.7:minmax,max").split(":")
        for normalise, alpha in itertools.product(norms.split(","), alphas.split(",")):
            # The retriever calls the `fuse` it imported: that name is the one to replace.
            retriever.fuse = convex(float(alpha), normalise)  # type: ignore[attr-defined]
            rows.append((f"convex alpha={alpha} ({normalise})", one_run(args)))
            print(f"{rows[-1][0]}: {rows[-1][1][1]}", file=sys.stderr)
        retriever.fuse = fusion.fuse  # type: ignore[attr-defined]
    label = "" if args.informal is None else f", informal questions (seed {args.informal})"
    print(f"\nhybrid R@5 / R@10 / R@25 through RetrievalService, {args.data.name}{label}\n")
    print("| lever | all | multi-hop | temporal | single-hop | adversarial |")
    print("|---|---|---|---|---|---|")
    for name, cells in rows:
        print(f"| {name} | {cells[1]} | {cells[2]} | {cells[3]} | {cells[5]} | {cells[6]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
