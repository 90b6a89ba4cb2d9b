"""BM25 in Tantivy vs BM25 on Qdrant sparse vectors: lexical recall@k side by side.

The lexical port alone, in-process, no embedding and no gateway: every turn of a
LoCoMo-format file goes as its context document (documents.py: date, speaker, previous
turn, attachment) into

* `tantivy`             TantivyIndex, typo repair off: BM25 alone,
* `qdrant-edge`         EdgeLexicalIndex (the Qdrant engine in-process), repair off,
* `qdrant-local`        QdrantLexicalIndex over qdrant-client's local mode (a server's
                        API, brute force in Python), repair off,
* `tantivy+typos`       and `qdrant-edge+typos`: with typo repair, the product default
                        (local mode would take minutes: one brute-force pass per
                        candidate word),

and every question with evidence is asked of each (LEXICAL, top 25, in its
conversation's user scope). Reports evidence R@5/10/25 per category and overall, the
mean overlap of each index's top 10 with Tantivy's (with repair: with Tantivy's with
repair), and search latency. The hybrid
comparison through the whole service is `bench/recall_locomo.py --compare
HIPPO_RETRIEVAL_LEXICAL_INDEX=tantivy,qdrant`.

`--hybrid` asks HYBRID instead, of the retrieval service itself (RetrievalService over a
SQLite store, in-process, typo repair on, the service's default fusion), once per arm:
`tantivy` (Tantivy + vectors in the Qdrant engine, the default), `qdrant-edge` (both
indexes in the Qdrant engine), `qdrant-local` (both as collections through qdrant-client's
local mode: a server's path), `qdrant-fused` (both in one collection through local mode,
fused by the engine's weighted RRF: `fusion=server`). Turns and questions are embedded
once, with the built-in model, as the gateway embeds them.

    .venv/bin/python bench/lexical_parity.py [--data FILE] [--informal SEED] [--hybrid]
        [--arms tantivy,qdrant-local,qdrant-fused]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from informal import informal
from qdrant_client import QdrantClient
from stats import recall_at

from hippo_cli import locomo
from hippo_retrieval.adapters.sparse_lexical import EdgeLexicalIndex, QdrantLexicalIndex
from hippo_retrieval.adapters.tantivy_index import TantivyIndex
from hippo_retrieval.domain.documents import ATTACHMENT, SPEAKER, lexical_document
from hippo_retrieval.domain.models import Role, Scope, StoredTurn

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
KS = (5, 10, 25)
TENANT = "bench"
HYBRID_ARMS = ("tantivy", "qdrant-edge", "qdrant-local", "qdrant-fused")
NAMESPACE = uuid.UUID("9a4c1a52-2f0e-4a57-9d8e-0f5d6b3c2a11")


def stored_turns(conversations: list[locomo.Conversation]) -> list[StoredTurn]:
    """Each conversation as one user's turns, sessions as `hippo replay` maps them."""
    out: list[StoredTurn] = []
    for conv in conversations:
        previous: StoredTurn | None = None
        for t in conv.turns:
            metadata = {SPEAKER: t.speaker}
            if t.caption:
                metadata[ATTACHMENT] = t.caption
            turn = StoredTurn(
                seq=len(out) + 1,
                memory_id=str(uuid.uuid5(NAMESPACE, f"{conv.sample_id}/{t.dia_id}")),
                tenant=TENANT,
                user=conv.sample_id,
                session=f"session_{t.session}",
                role=Role.USER if t.speaker == conv.speaker_a else Role.ASSISTANT,
                text=t.text,
                time_us=t.time_us,
                client_id=t.dia_id,
                metadata=metadata,
                vector=None,
            )
            same_session = previous is not None and previous.session == turn.session
            document = lexical_document(turn, previous if same_session else None)
            out.append(replace(turn, document=document))
            previous = turn
    return out


def always(client: QdrantClient) -> Callable[[], QdrantClient]:
    return lambda: client


def questions_of(
    conversations: list[locomo.Conversation], seed: int | None
) -> list[tuple[str, locomo.Question, str]]:
    """(user, question, the text asked) for every question with evidence."""
    return [
        (conv.sample_id, q, q.question if seed is None else informal(q.question, seed))
        for conv in conversations
        for q in conv.questions
        if q.evidence
    ]


async def hybrid(conversations: list[locomo.Conversation], args: argparse.Namespace) -> int:
    from hippo_core.embedding import vector_text
    from hippo_embedding.adapters.onnx_encoder import OnnxEncoder
    from hippo_retrieval.adapters.generations import LocalIndexSet, QdrantServer
    from hippo_retrieval.adapters.sqlite_store import SqliteTurnStore
    from hippo_retrieval.domain.models import Mode, NewTurn
    from hippo_retrieval.domain.retriever import FusionConfig
    from hippo_retrieval.domain.service import ProjectionConfig, RetrievalService
    from hippo_retrieval.domain.validation import Limits

    class Shared(QdrantClient):
        """Local mode locks its folder per client: the index set's collections share one."""

        def close(self, grpc_grace: float | None = None, **kwargs: Any) -> None:
            pass

    turns = stored_turns(conversations)
    asked = questions_of(conversations, args.informal)
    encoder = OnnxEncoder(threads=2)
    print(f"embedding {len(turns)} turns and {len(asked)} questions ...", file=sys.stderr)
    turn_vectors = encoder.encode([vector_text(t.text, t.metadata) for t in turns])
    query_vectors = encoder.encode([text for _, _, text in asked])
    new = [
        NewTurn(
            t.memory_id, t.tenant, t.user, t.session, t.role, t.text, t.time_us,
            t.client_id, t.metadata, turn_vectors[i],
        )
        for i, t in enumerate(turns)
    ]  # fmt: skip
    dia = {t.memory_id: t.client_id for t in turns}
    table: dict[str, dict[str, list[float]]] = {}
    latency: dict[str, list[float]] = {}
    for arm in args.arms.split(","):
        with tempfile.TemporaryDirectory(prefix="hippo-hybrid-") as tmp:
            root = Path(tmp)
            local = arm in ("qdrant-local", "qdrant-fused")
            shared = Shared(path=str(root / "qdrant")) if local else None
            server = None
            if shared is not None:
                server = QdrantServer("local", None, "bench", 30.0, connect=always(shared))
            lexical = "tantivy" if arm == "tantivy" else "qdrant"
            fused = arm == "qdrant-fused"
            service = RetrievalService(
                SqliteTurnStore(root / "turns.sqlite3"),
                LocalIndexSet(root, server=server, typos=True, lexical=lexical, fused=fused),
                fusion=FusionConfig(),
                projection=ProjectionConfig(purge_delay_s=None, filter_keys=frozenset()),
                limits=Limits(max_turns=1024, dimension=len(turn_vectors[0])),
                threads=2,
            )
            service.open()
            try:
                for start in range(0, len(new), 500):
                    await service.write(TENANT, new[start : start + 500], True, 60.0)
                rows: dict[str, list[float]] = defaultdict(list)
                seconds: list[float] = []
                for i, (user, q, text) in enumerate(asked):
                    started = time.perf_counter()
                    result = await service.search(
                        Scope(TENANT, user), text, query_vectors[i], Mode.HYBRID, max(KS)
                    )
                    seconds.append(time.perf_counter() - started)
                    found = [dia[h.turn.memory_id] for h in result.hits]
                    for group in ("all", str(q.category)):
                        for k in KS:
                            rows[f"{group}@{k}"].append(recall_at(q.evidence, found, k))
                table[arm], latency[arm] = rows, seconds
            finally:
                service.close()
                if shared is not None:
                    QdrantClient.close(shared)
    label = (
        "" if args.informal is None else f", questions rewritten informally (seed {args.informal})"
    )
    print(f"\nhybrid recall@k (%) through RetrievalService, {args.data.name}{label}\n")
    groups = ["all", "1", "2", "3", "4", "5"]
    names = {g: g if g == "all" else locomo.CATEGORIES[int(g)] for g in groups}
    print("| arm | " + " | ".join(f"{names[g]} R@5 / R@10 / R@25" for g in groups) + " | p50 ms |")
    print("|" + "---|" * (len(groups) + 2))
    for arm, rows in table.items():
        cells = " | ".join(
            " / ".join(f"{100 * statistics.fmean(rows[f'{g}@{k}']):.1f}" for k in KS)
            for g in groups
        )
        print(f"| {arm} | {cells} | {1000 * statistics.median(latency[arm]):.1f} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--informal", type=int, metavar="SEED", help="ask typo-laden rewrites")
    parser.add_argument("--hybrid", action="store_true", help="HYBRID through the service")
    parser.add_argument(
        "--arms",
        default=",".join(HYBRID_ARMS),
        help="with --hybrid: which arms, comma-separated (default all)",
    )
    args = parser.parse_args()
    if set(args.arms.split(",")) - set(HYBRID_ARMS):
        parser.error(f"--arms: each of {', '.join(HYBRID_ARMS)}")
    conversations = locomo.load(args.data)
    if args.hybrid:
        return asyncio.run(hybrid(conversations, args))
    turns = stored_turns(conversations)
    dia = {t.memory_id: t.client_id for t in turns}
    with tempfile.TemporaryDirectory(prefix="hippo-lexical-") as tmp:
        root = Path(tmp)
        opened: dict[str, Any] = {
            "tantivy": TantivyIndex(root / "tantivy"),
            "qdrant-edge": EdgeLexicalIndex(root / "edge"),
            "qdrant-local": QdrantLexicalIndex(QdrantClient(path=str(root / "local")), "bench"),
            "tantivy+typos": TantivyIndex(root / "tantivy-typos", typos=True),
            "qdrant-edge+typos": EdgeLexicalIndex(root / "edge-typos", typos=True),
        }
        load_s: dict[str, float] = {}
        for name, index in opened.items():
            started = time.perf_counter()
            for page in range(0, len(turns), 500):
                index.apply(turns[page : page + 500])
            index.commit()
            load_s[name] = time.perf_counter() - started
        rows: dict[str, dict[str, list[float]]] = {n: defaultdict(list) for n in opened}
        overlap: dict[str, list[float]] = defaultdict(list)
        latency: dict[str, list[float]] = defaultdict(list)
        asked = 0
        for conv in conversations:
            scope = Scope(tenant=TENANT, user=conv.sample_id)
            for q in conv.questions:
                if not q.evidence:
                    continue
                asked += 1
                text = q.question if args.informal is None else informal(q.question, args.informal)
                found: dict[str, list[str]] = {}
                for name, index in opened.items():
                    search: Callable[..., Any] = index.search
                    started = time.perf_counter()
                    hits = search(scope, text, max(KS))
                    latency[name].append(time.perf_counter() - started)
                    found[name] = [dia[h.memory_id] for h in hits]
                    for group in ("all", str(q.category)):
                        for k in KS:
                            rows[name][f"{group}@{k}"].append(recall_at(q.evidence, found[name], k))
                for name in opened:
                    base_name = "tantivy+typos" if name.endswith("+typos") else "tantivy"
                    top, base = set(found[name][:10]), set(found[base_name][:10])
                    overlap[name].append(len(top & base) / max(1, len(base)))
        for index in opened.values():
            index.close()
    print(f"\nlexical recall@k (%), {args.data.name}: {len(turns)} turns, {asked} questions")
    print(
        "" if args.informal is None else f"(questions rewritten informally, seed {args.informal})"
    )
    groups = ["all", "1", "2", "3", "4", "5"]
    head = "| index | " + " | ".join(
        f"{g if g == 'all' else locomo.CATEGORIES[int(g)]} R@{k}" for g in groups for k in KS[:2]
    )
    print(head + " | all R@25 | top-10 overlap with tantivy | p50 ms | load s |")
    print("|" + "---|" * (len(groups) * 2 + 5))
    for name in opened:
        cells = " | ".join(
            f"{100 * statistics.fmean(rows[name][f'{g}@{k}']):.1f}" for g in groups for k in KS[:2]
        )
        print(
            f"| {name} | {cells} | {100 * statistics.fmean(rows[name]['all@25']):.1f} | "
            f"{100 * statistics.fmean(overlap[name]):.0f}% | "
            f"{1000 * statistics.median(latency[name]):.2f} | {load_s[name]:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
