"""The search indexes at a million turns: Tantivy + dense vectors vs Qdrant sparse + dense.

Loads N turns spread over U users into each arm's two indexes, in-process (the indexes
alone: no turn store, no gateway), then asks real questions of random users:

* `tantivy`  TantivyIndex + EdgeVectorIndex (the embedded default),
* `qdrant`   EdgeLexicalIndex (BM25 on sparse vectors) + EdgeVectorIndex: everything in
             the Qdrant engine, as stateless retrieval keeps it on a Qdrant server.

Each arm runs in a child process of its own, so its memory is its own. Reports per arm:
load rate (turns/s into both indexes, and each alone), disk bytes per turn (each index),
resident memory after the load, and search latency p50/p95 for BM25, for vectors (top 100
in one user's scope: the candidates a Recall fuses) and for both one after the other.

Turn texts are the dev file's turns (each with its context document: previous turn, date,
speaker), with one word of another turn added so that texts repeat less; vectors are
random unit vectors (latency and size do not depend on what they mean). Typo repair is
off in both arms (it costs only for misspelt words; bench/lexical_parity.py measures it).

    .venv/bin/python bench/index_scale.py [--turns 1000000] [--users 1000] [--arms tantivy,qdrant]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from stats import percentile

from hippo_cli import locomo
from hippo_retrieval.adapters.edge_vectors import EdgeVectorIndex
from hippo_retrieval.adapters.sparse_lexical import EdgeLexicalIndex
from hippo_retrieval.adapters.tantivy_index import TantivyIndex
from hippo_retrieval.domain.documents import SPEAKER, lexical_document
from hippo_retrieval.domain.models import Role, Scope, StoredTurn

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
DIM = 384
PAGE = 2000
SESSION_TURNS = 20
CANDIDATES = 100
NAMESPACE = uuid.UUID("5b0c6a8e-51d3-4a2f-9a57-3f1f0b9e7c21")


def turns(data: Path, count: int, users: int, seed: int) -> Any:
    """`count` turns, in pages of PAGE: user i's turns, sessions of SESSION_TURNS."""
    source = [t for c in locomo.load(data) for t in c.turns]
    words = [w for t in source for w in t.text.split() if w.isalpha() and len(w) > 3]
    rng = random.Random(seed)
    vectors = np.random.default_rng(seed)
    per_user = max(1, count // users)
    page: list[StoredTurn] = []
    previous: StoredTurn | None = None
    for n in range(count):
        user, k = divmod(n, per_user)
        t = source[rng.randrange(len(source))]
        row = vectors.normal(size=DIM).astype(np.float32)
        turn = StoredTurn(
            seq=n + 1,
            memory_id=str(uuid.uuid5(NAMESPACE, str(n))),
            tenant="bench",
            user=f"u{user}",
            session=f"s{k // SESSION_TURNS}",
            role=Role.USER if n % 2 else Role.ASSISTANT,
            text=f"{t.text} {rng.choice(words)}",
            time_us=t.time_us + k,
            client_id="",
            metadata={SPEAKER: t.speaker},
            vector=row / np.linalg.norm(row),
        )
        first = previous is None or previous.session != turn.session or previous.user != turn.user
        page.append(replace(turn, document=lexical_document(turn, None if first else previous)))
        previous = turn
        if len(page) == PAGE:
            yield page
            page = []
    if page:
        yield page


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    """One arm, in this process (the child)."""
    root = Path(args.dir)
    lexical: Any = (
        TantivyIndex(root / "lexical")
        if args.arm == "tantivy"
        else EdgeLexicalIndex(root / "lexical")
    )
    vectors = EdgeVectorIndex(root / "vectors", DIM)
    before = rss_bytes()
    lexical_s = vector_s = 0.0
    loaded = 0
    for page in turns(Path(args.data), args.turns, args.users, args.seed):
        started = time.perf_counter()
        lexical.apply(page)
        lexical.commit()
        lexical_s += time.perf_counter() - started
        started = time.perf_counter()
        vectors.apply(page)
        vector_s += time.perf_counter() - started
        loaded += len(page)
        if loaded % 100_000 == 0:
            print(f"{args.arm}: {loaded} turns", file=sys.stderr, flush=True)
    questions = [q.question for c in locomo.load(Path(args.data)) for q in c.questions]
    rng = random.Random(args.seed + 1)
    query_vectors = np.random.default_rng(args.seed + 1)
    timings: dict[str, list[float]] = {"bm25": [], "vectors": [], "both": []}
    for _ in range(args.queries):
        scope = Scope("bench", f"u{rng.randrange(args.users)}")
        row = query_vectors.normal(size=DIM).astype(np.float32)
        started = time.perf_counter()
        lexical.search(scope, rng.choice(questions), CANDIDATES)
        middle = time.perf_counter()
        vectors.search(scope, row / np.linalg.norm(row), CANDIDATES)
        done = time.perf_counter()
        timings["bm25"].append(middle - started)
        timings["vectors"].append(done - middle)
        timings["both"].append(done - started)
    resident = rss_bytes()
    lexical.close()
    vectors.close()
    return {
        "arm": args.arm,
        "turns": loaded,
        "load_turns_per_s": loaded / (lexical_s + vector_s),
        "bm25_turns_per_s": loaded / lexical_s,
        "vectors_turns_per_s": loaded / vector_s,
        "bm25_bytes_per_turn": disk_bytes(root / "lexical") / loaded,
        "vectors_bytes_per_turn": disk_bytes(root / "vectors") / loaded,
        "rss_mb": resident / 2**20,
        "rss_growth_bytes_per_turn": (resident - before) / loaded,
        "latency_ms": {
            name: {"p50": 1000 * percentile(v, 50), "p95": 1000 * percentile(v, 95)}
            for name, v in timings.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--arms", default="tantivy,qdrant")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # the child's own arm
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args)))
        return 0
    results = []
    for arm in args.arms.split(","):
        with tempfile.TemporaryDirectory(prefix=f"hippo-scale-{arm}-") as tmp:
            command = [sys.executable, __file__, "--arm", arm, "--dir", tmp]
            command += ["--data", args.data, "--turns", str(args.turns)]
            command += ["--users", str(args.users), "--queries", str(args.queries)]
            command += ["--seed", str(args.seed)]
            print(f"{arm}: loading {args.turns} turns over {args.users} users ...", file=sys.stderr)
            out = subprocess.run(
                command, check=True, capture_output=True, text=True, env=os.environ
            )
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\n{args.turns} turns over {args.users} users, in-process, one child per arm\n")
    print(
        "| arm | load turns/s (BM25 / vectors alone) | BM25 B/turn | vectors B/turn | RSS MB "
        "| BM25 p50 / p95 ms | vectors p50 / p95 ms | both p50 / p95 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        lat = r["latency_ms"]
        print(
            f"| {r['arm']} | {r['load_turns_per_s']:.0f} ({r['bm25_turns_per_s']:.0f} / "
            f"{r['vectors_turns_per_s']:.0f}) | {r['bm25_bytes_per_turn']:.0f} | "
            f"{r['vectors_bytes_per_turn']:.0f} | {r['rss_mb']:.0f} | "
            + " | ".join(
                f"{lat[k]['p50']:.1f} / {lat[k]['p95']:.1f}" for k in ("bm25", "vectors", "both")
            )
            + " |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
