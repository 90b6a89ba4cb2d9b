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

    .venv/bin/python bench/recall_levers.py --lever prf|convex [--informal SEED] [--grid ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import lexical_parity as lp
from tantivy import Occur, Query

import hippo_retrieval.adapters.tantivy_index as ti
import hippo_retrieval.domain.fusion as fusion
import hippo_retrieval.domain.retriever as retriever
from hippo_cli import locomo
from hippo_embedding.adapters.onnx_encoder import OnnxEncoder
from hippo_retrieval.adapters.analysis import clean_text
from hippo_retrieval.domain.models import Candidate, FusedHit, Scope

DOCUMENTS: dict[str, str] = {}  # memory_id -> its BM25 document (the feedback text)


def remember_documents() -> None:
    stored = lp.stored_turns

    def keep(conversations: list[locomo.Conversation]) -> list[Any]:
        turns = stored(conversations)
        DOCUMENTS.update((t.memory_id, t.document) for t in turns)
        return turns

    lp.stored_turns = keep


def embed_once() -> None:
    """The arms differ in BM25 only: the same texts are embedded once."""
    encode = OnnxEncoder.encode
    cache: dict[tuple[str, ...], Any] = {}

    def cached(self: OnnxEncoder, texts: Sequence[str]) -> Any:
        key = tuple(texts)
        if key not in cache:
            cache[key] = encode(self, texts)
        return cache[key]

    OnnxEncoder.encode = cached  # type: ignore[method-assign, assignment]


def with_feedback(
    search: Callable[..., list[Candidate]], m: int, t: int, w: float
) -> Callable[..., list[Candidate]]:
    def prf(self: ti.TantivyIndex, scope: Scope, query: str, limit: int) -> list[Candidate]:
        first = search(self, scope, query, limit)
        if len(first) < m:
            return first
        searcher = self._index.searcher()
        own = set(self._analysis.query_terms(query).text)
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
        base = self._text_query(query, searcher)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lever", choices=("prf", "convex"), required=True)
    parser.add_argument("--data", type=Path, default=lp.DEFAULT_DATA)
    parser.add_argument("--informal", type=int, metavar="SEED")
    parser.add_argument("--grid", help="the lever's settings (see the module docstring)")
    args = parser.parse_args()
    args.arms = "tantivy"
    remember_documents()
    embed_once()
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
