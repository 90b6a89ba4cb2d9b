"""Build the HNSW graph of an edge shard in a child process.

Why a child process: qdrant-edge builds the graph in `EdgeShard.optimize()`, which holds
the GIL for its whole run (measured: a Python thread got ~0.03% of its usual steps during
an 18 s optimize of 20k vectors; searches on other threads waited for it). In the
retrieval process that would stop every request for minutes at 100k vectors. So the
shard is closed in the service (it is a generation being rebuilt, searched by nobody
yet), this module opens it in a niced child, optimizes, flushes and closes it, and the
service opens it again.

    python -m hippo_retrieval.adapters.edge_graph SHARD_DIR DIMENSION
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeShard,
    EdgeVectorParams,
)

# The service decides when a graph is worth building (RetrievalService, graph_min_points),
# so the engine's own size threshold must not second-guess it: 1 KB indexes any segment.
INDEXING_THRESHOLD_KB = 1
# Let the serving process keep the CPU it needs: the graph takes what is left.
NICENESS = 10


class GraphBuildCancelled(RuntimeError):
    """The service is closing: the child was stopped and the graph is not built."""


def shard_config(dimension: int) -> EdgeConfig:
    """The one configuration of every edge shard (EdgeVectorIndex and this builder)."""
    return EdgeConfig(
        vectors=EdgeVectorParams(size=dimension, distance=Distance.Cosine),
        optimizers=EdgeOptimizersConfig(indexing_threshold=INDEXING_THRESHOLD_KB),
    )


def build(path: Path, dimension: int, cancelled: Callable[[], bool]) -> dict[str, float]:
    """Run the child on the (closed) shard at `path`; its stats (points, in_graph,
    seconds) on success. Polls `cancelled` twice a second and kills the child when it
    says so: the shard is then left as the engine's crash recovery leaves it."""
    child = subprocess.Popen(
        [sys.executable, "-m", __name__, str(path), str(dimension)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while True:
        if cancelled():
            child.kill()
            child.communicate()
            raise GraphBuildCancelled(f"graph build of {path} stopped")
        try:
            out, err = child.communicate(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            continue
    if child.returncode != 0:
        raise RuntimeError(f"graph build of {path} failed ({child.returncode}): {err[-2000:]}")
    stats: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return stats


def main() -> None:
    # The child lowers its own priority (a preexec_fn is unsafe in the threaded parent).
    os.nice(NICENESS)
    path, dimension = Path(sys.argv[1]), int(sys.argv[2])
    start = time.monotonic()
    shard = EdgeShard.load(str(path), shard_config(dimension))
    try:
        shard.optimize()
        shard.flush()
        info = shard.info()
    finally:
        shard.close()
    stats = {
        "points": info.points_count,
        "in_graph": info.indexed_vectors_count,
        "seconds": round(time.monotonic() - start, 3),
    }
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
