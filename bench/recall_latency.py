"""Recall latency through the gateway as one user's memory grows: 1k, 10k, 100k turns.

A private cluster is started (free ports, temporary data dir). Turns are real LoCoMo
sentences (cycled, each made distinct by a serial token so BM25 statistics stay
realistic); their vectors are the real embeddings of those sentences with a little noise,
written through the retrieval service in bulk (embedding 100k turns through Remember
would take most of an hour on 2 cores and measure the embedder, not Recall). Queries are
the LoCoMo questions, asked one at a time through the gateway, so each figure includes the
query's embedding, the gateway hop and both retrievers. `--million` adds 1M turns spread
over 100 users (10k each) to show that other users' data does not slow a user down.

Side by side, in one run: the same load and questions against a cluster that never
builds the vector graph (`graph off`: HIPPO_RETRIEVAL_GRAPH_MIN_POINTS=0, every search
scores the user's vectors one by one) and one with the shipped default (`graph on`: a
background rebuild builds the HNSW graph once enough vectors are outside it). With the
graph on, each size is measured after the background rebuilds are done (the seconds that
took are reported); if a rebuild was running right after the load, Recall is also
measured while it ran (`hybrid, graph building`): searches must not stall meanwhile.

    .venv/bin/python bench/recall_latency.py [--sizes 1000,10000,100000] [--million]
        [--graph on,off]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from hippo.memory.v1 import memory_pb2
from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_cli import api, locomo
from hippo_cli.cluster import local_cluster
from hippo_cli.settings import CliSettings
from hippo_core import client
from hippo_embedding.adapters import load
from hippo_embedding.settings import EmbeddingSettings
from hippo_retrieval.domain.models import GraphState
from hippo_retrieval.settings import RetrievalSettings

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
OUT = ROOT / "bench" / "out"
MODES = ("hybrid", "lexical", "semantic")
BATCH = 400  # turns per Write: ~0.7 MB with vectors, under the 1 MiB channel default


def corpus() -> tuple[list[str], list[str]]:
    """Sentences and questions: the dev data when present, else generated prose."""
    if DATA.exists():
        convs = locomo.load(DATA)
        return [t.text for c in convs for t in c.turns], [
            q.question for c in convs for q in c.questions
        ]
    words = [
        "garden",
        "report",
        "meeting",
        "sister",
        "trip",
        "budget",
        "concert",
        "recipe",
        "deadline",
        "puppy",
    ]
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, 12)) for _ in range(1500)]
    return texts, [" ".join(rng.choice(words, 6)) + "?" for _ in range(300)]


async def fill(
    addr: str, tenant: str, users: list[str], per_user: int, texts: list[str], base: np.ndarray
) -> float:
    """Write `per_user` turns for each user straight into retrieval; returns turns/s."""
    rng = np.random.default_rng(len(users) * per_user)
    started, written = time.perf_counter(), 0
    async with client.channel(addr) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        for user in users:
            for start in range(0, per_user, BATCH):
                n = min(BATCH, per_user - start)
                idx = rng.integers(0, len(texts), n)
                vectors = base[idx] + rng.normal(0, 0.02, (n, base.shape[1])).astype(np.float32)
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                turns = [
                    retrieval_pb2.NewTurn(
                        memory_id=str(uuid.uuid4()),
                        user_id=user,
                        session_id=f"s{(start + i) // 40}",
                        role=memory_pb2.ROLE_USER if i % 2 else memory_pb2.ROLE_ASSISTANT,
                        text=f"{texts[j]} (note {start + i})",
                        time_us=1_600_000_000_000_000 + (start + i) * 60_000_000,
                        vector=vectors[i].astype("<f4").tobytes(),
                    )
                    for i, j in enumerate(idx)
                ]
                await stub.Write(
                    retrieval_pb2.WriteRequest(tenant=tenant, turns=turns), timeout=120
                )
                written += n
        # Wait until both indexes have applied everything (bulk loads lag a little).
        while True:
            status = await stub.Status(retrieval_pb2.StatusRequest(), timeout=10)
            if status.lexical_seq == status.vector_seq == status.last_seq:
                break
            await asyncio.sleep(0.2)
    return written / (time.perf_counter() - started)


async def probe(
    settings: CliSettings, user: str, questions: list[str], mode: str, until: Any = None
) -> list[float]:
    """Recall latencies in ms, one call at a time; stops early once `until()` is true."""
    out: list[float] = []
    async with api.gateway(settings) as stub:
        for q in questions:
            if until is not None and await until():
                break
            request = memory_pb2.RecallRequest(
                scope=memory_pb2.Scope(user_id=user), query=q, mode=api.MODES[mode], top_k=10
            )
            started = time.perf_counter()
            await stub.Recall(request, metadata=api.metadata(settings), timeout=30)
            out.append(1000 * (time.perf_counter() - started))
    return out


async def index_status(addr: str) -> retrieval_pb2.StatusResponse:
    async with client.channel(addr) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        reply: retrieval_pb2.StatusResponse = await stub.Status(
            retrieval_pb2.StatusRequest(), timeout=10
        )
        return reply


async def graph_settled(addr: str, minimum: int) -> bool:
    """No rebuild running, and too few vectors outside the graph for the service to start
    one (its own rule, GraphState.due; every turn has a vector here)."""
    status = await index_status(addr)
    state = GraphState(points=status.turns, in_graph=status.turns - status.vectors_outside_graph)
    return not status.rebuilding and not state.due(minimum)


async def reindex(addr: str) -> float:
    """`hippo reindex`: a rebuild now, which puts every vector in the graph; seconds."""
    started = time.perf_counter()
    async with client.channel(addr) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        async for reply in stub.Reindex(retrieval_pb2.ReindexRequest(), timeout=3600):
            if reply.done:
                break
    return time.perf_counter() - started


async def wait_graph(addr: str, minimum: int, timeout: float = 3600) -> float:
    started = time.perf_counter()
    while not await graph_settled(addr, minimum):
        if time.perf_counter() - started > timeout:
            raise TimeoutError("the background graph rebuilds did not finish")
        await asyncio.sleep(1.0)
    return time.perf_counter() - started


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colours = dict(zip(MODES, ("C3", "C0", "C2"), strict=True))
    for graph in sorted({r["graph"] for r in rows}):
        for mode in MODES:
            pts = sorted(
                (r["turns_per_user"], r["p95_ms"])
                for r in rows
                if r["mode"] == mode and r["users"] == 1 and r["graph"] == graph
            )
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    "-" if graph.startswith("on") else ":",
                    color=colours[mode],
                    marker="o",
                    label=f"{mode} p95, graph {graph}",
                )
    ax.plot([10_000], [25], "k*", ms=10, label="target p95: 25 ms at 10k (hybrid)")
    ax.plot([100_000], [50], "kX", ms=9, label="target p95: 50 ms at 100k (hybrid)")
    ax.set_xscale("log")
    ax.set_xlabel("turns stored for the user")
    ax.set_ylabel("Recall latency through the gateway (ms)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def row(
    where: dict[str, Any], mode: str, ms: list[float], outside: int, **extra: Any
) -> dict[str, Any]:
    return {
        **where,
        "mode": mode,
        "n": len(ms),
        "p50_ms": pct(ms, 50),
        "p95_ms": pct(ms, 95),
        "p99_ms": pct(ms, 99),
        "outside_graph": outside,
        **extra,
    }


def measure(
    graph: str,
    sizes: list[int],
    million: bool,
    texts: list[str],
    questions: list[str],
    base: np.ndarray,
) -> list[dict[str, Any]]:
    """One cluster, graph on or off, filled size by size; a row per size and mode."""
    minimum = RetrievalSettings().graph_min_points if graph == "on" else 0
    # The cache off: questions repeat across sizes and modes, and every Recall should pay
    # for its query's embedding as a fresh question would.
    env = {"HIPPO_EMBEDDING_CACHE_ENTRIES": "0", "HIPPO_RETRIEVAL_GRAPH_MIN_POINTS": str(minimum)}
    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="hippo-latency-") as tmp,
        local_cluster(Path(tmp), env) as cluster,
    ):
        settings = CliSettings(gateway_addr=cluster.gateway, api_key=CliSettings().api_key)
        retrieval = cluster.addrs["retrieval"]
        stored = 0
        plan = [(1, size) for size in sizes] + ([(100, 10_000)] if million else [])
        for users_n, per_user in plan:
            users = [f"u{users_n}x{per_user}-{i}" for i in range(users_n)]
            rate = asyncio.run(fill(retrieval, "local", users, per_user, texts, base))
            stored += users_n * per_user
            print(
                f"graph {graph}: stored {users_n} x {per_user} turns ({rate:.0f} turns/s); "
                f"{stored} in all",
                file=sys.stderr,
            )

            where = {
                "graph": graph,
                "users": users_n,
                "turns_per_user": per_user,
                "turns_total": stored,
            }
            wait_s = 0.0
            if minimum:
                if asyncio.run(index_status(retrieval)).rebuilding:
                    ms = asyncio.run(
                        probe(
                            settings,
                            users[-1],
                            questions,
                            "hybrid",
                            until=lambda: graph_settled(retrieval, minimum),
                        )
                    )
                    if ms:
                        rows.append(row(where, "hybrid, graph building", ms, -1))
                wait_s = asyncio.run(wait_graph(retrieval, minimum))
                print(f"graph {graph}: rebuilds settled after {wait_s:.0f} s more", file=sys.stderr)
            outside = asyncio.run(index_status(retrieval)).vectors_outside_graph
            asyncio.run(probe(settings, users[0], questions[:20], "hybrid"))  # warm caches
            for mode in MODES:
                ms = asyncio.run(probe(settings, users[-1], questions, mode))
                rows.append(row(where, mode, ms, outside, graph_wait_s=wait_s))
            if minimum and stored >= minimum and outside:
                # What an operator gets with `hippo reindex` after a bulk load.
                took = asyncio.run(reindex(retrieval))
                print(f"graph {graph}: reindex took {took:.0f} s", file=sys.stderr)
                outside = asyncio.run(index_status(retrieval)).vectors_outside_graph
                after = where | {"graph": "on, after reindex"}
                for mode in MODES:
                    ms = asyncio.run(probe(settings, users[-1], questions, mode))
                    rows.append(row(after, mode, ms, outside, reindex_s=took))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200, help="Recall calls per size and mode")
    parser.add_argument("--million", action="store_true", help="also 1M turns over 100 users")
    parser.add_argument("--graph", default="off,on", help="which clusters: off, on or both")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    texts, questions = corpus()
    questions = (questions * (args.queries // len(questions) + 1))[: args.queries]
    encoder = load(EmbeddingSettings())
    base = np.concatenate([encoder.encode(texts[i : i + 64]) for i in range(0, len(texts), 64)])
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict[str, Any]] = []
    for graph in args.graph.split(","):
        rows += measure(graph, sizes, args.million, texts, questions, base)
    print(
        "\n| graph | users | turns/user | turns stored | mode | n | p50 ms | p95 ms | p99 ms "
        "| vectors outside the graph |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        outside = "-" if r["outside_graph"] < 0 else f"{r['outside_graph']}"
        print(
            f"| {r['graph']} | {r['users']} | {r['turns_per_user']} | {r['turns_total']} | "
            f"{r['mode']} | {r['n']} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {outside} |"
        )
    for r in rows:
        if r["mode"] == "hybrid" and r.get("graph_wait_s", 0) >= 1:
            print(
                f"graph on, {r['turns_total']} turns stored: background rebuilds settled "
                f"{r['graph_wait_s']:.0f} s after the load"
            )
        if r["mode"] == "hybrid" and r.get("reindex_s"):
            print(f"{r['turns_total']} turns stored: hippo reindex took {r['reindex_s']:.0f} s")
    OUT.mkdir(parents=True, exist_ok=True)
    plot(rows, OUT / "recall_latency.png")
    print(f"\nplot: {OUT / 'recall_latency.png'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
