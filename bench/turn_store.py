"""The turn store's reads on a hybrid Recall's path, SQLite: `locate` (session, position,
speaker and content words of ~200 candidates, for the neighbour, speaker and short-turn
steps) and `get` (the winners' rows), at `--turns` turns of one user.

`locate` is timed three ways in the same run: as the store runs it (answered from the
covering index `turns_places`, which since migration 4 holds each turn's stored count of
content words too); as it ran before the short-turn step (the same index without the
count: a query that does not read it); and as it ran before that index (each id probed
in UNIQUE (tenant, memory_id), then the table's row read: text and vector included).

    .venv/bin/python bench/turn_store.py [--turns 10000] [--ids 180] [--rounds 300]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from stats import percentile

from hippo_retrieval.adapters.sqlite_store import BY_ID_USER, SqliteTurnStore
from hippo_retrieval.domain.models import NewTurn, Role

TEXT = "I went to the pottery class last Tuesday and made a bowl, it turned out great! "


def fill(store: SqliteTurnStore, turns: int) -> list[str]:
    rng = np.random.default_rng(0)
    ids = []
    batch = []
    for i in range(turns):
        batch.append(
            NewTurn(
                memory_id=f"m{i:07d}",
                tenant="local",
                user="u",
                session=f"s{i // 40}",
                role=Role.USER if i % 2 else Role.ASSISTANT,
                text=TEXT * (1 + i % 3),
                time_us=1_700_000_000_000_000 + i,
                metadata={"speaker": "Caroline" if i % 2 else "Melanie"},
                vector=rng.standard_normal(384).astype(np.float32),
                vector_model="builtin",
            )
        )
        ids.append(batch[-1].memory_id)
        if len(batch) == 1000:
            store.append(batch)
            batch = []
    store.append(batch)
    return ids


def timed(fn: Callable[[list[str]], object], lists: list[list[str]]) -> list[float]:
    fn(lists[0])
    out = []
    for ids in lists:
        started = time.perf_counter()
        fn(ids)
        out.append(1000 * (time.perf_counter() - started))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--ids", type=int, default=180, help="candidates located per call")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteTurnStore(Path(tmp) / "turns.db")
        try:
            ids = fill(store, args.turns)
            rng = random.Random(1)
            lists = [rng.sample(ids, min(args.ids, len(ids))) for _ in range(args.rounds)]
            conn = store._conn

            def by(index: str) -> Callable[[list[str]], object]:
                """locate's query without the content words, through `index`."""

                def query(wanted: list[str]) -> object:
                    marks = ",".join("?" * len(wanted))
                    return conn.execute(
                        "SELECT memory_id, session_id, position, "
                        f"json_extract(metadata, '$.speaker') FROM turns t INDEXED BY {index} "
                        f"WHERE t.tenant = ? AND {BY_ID_USER} AND t.memory_id IN ({marks})",
                        ("local", "u", *wanted),
                    ).fetchall()

                return query

            rows = {
                f"locate {args.ids} ids, before migration 3 (row reads)": timed(
                    by("sqlite_autoindex_turns_1"), lists
                ),
                f"locate {args.ids} ids, without the content words": timed(
                    by("turns_places"), lists
                ),
                f"locate {args.ids} ids, now (covering index, with the content words)": timed(
                    lambda w: store.locate("local", "u", w), lists
                ),
                "get 10 rows": timed(lambda w: store.get("local", "u", w[:10]), lists),
            }
        finally:
            store.close()
    print(f"\nSQLite turn store, {args.turns} turns of one user, {args.rounds} calls each\n")
    print("| read | p50 ms | p95 ms |")
    print("|---|---|---|")
    for name, ms in rows.items():
        print(f"| {name} | {percentile(ms, 50):.3f} | {percentile(ms, 95):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
