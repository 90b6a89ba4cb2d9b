"""Evidence recall@k on LoCoMo-format conversations, through the running Memory API.

Replays a LoCoMo-format file (one user per conversation, `hippo replay`'s mapping), then
asks every question in LEXICAL, SEMANTIC and HYBRID mode and reports, per category and
overall (categories 1-4, and all five), the share of each question's evidence turns found
in the top k (k = 1, 5, 10, 20, 25), plus ingest turns/s and Recall latency p50/p95.

By default it starts a private cluster (`hippo up` on free ports, a temporary data dir);
`--gateway ADDR --api-key KEY` measures a cluster that is already running instead.

    .venv/bin/python bench/recall_locomo.py [--data FILE] [--json OUT] [--informal SEED]
        [--date-order dmy|mdy]

`--informal SEED` also asks every question as people type it (bench/informal.py: chat
spellings, dropped apostrophes, keyboard slips), in LEXICAL and HYBRID mode.

`--chatty SEED` stores the conversations the way people chat instead (bench/chatty.py:
one message per sentence, fillers such as "lol" from the other side in between, lower
case, chat spellings and slips); an evidence turn counts as found when any of its
messages is among the top k.

`--compare KEY=A,B[,...]` measures one private cluster per value of the setting KEY, one
after the other in this run, and prints each table, then the differences from the first
value (e.g. `--compare HIPPO_RETRIEVAL_LEXICAL_INDEX=tantivy,qdrant`: BM25 in Tantivy vs
in Qdrant sparse vectors).

Published anchors (turn level, all categories; LoCoMo paper, Maharana et al. 2024): the
DRAGON retriever reaches R@5 56.7, R@10 66.2, R@25 76.7.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from chatty import chatty
from informal import informal
from stats import percentile, recall_at

from hippo.memory.v1 import memory_pb2
from hippo_cli import api, locomo
from hippo_cli.cluster import local_cluster
from hippo_cli.dates import ORDERS, Order
from hippo_cli.replay import Ledger, replay_all
from hippo_cli.settings import CliSettings

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
KS = (1, 5, 10, 20, 25)
DRAGON = {5: 56.7, 10: 66.2, 25: 76.7}
MODES = ("lexical", "semantic", "hybrid")
INFORMAL_MODES = ("lexical informal", "semantic informal", "hybrid informal")  # --informal
OUT = ROOT / "bench" / "out"


async def ask_all(
    settings: CliSettings,
    conversations: list[locomo.Conversation],
    prefix: str,
    mode: str,
    top_k: int,
    informal_seed: int | None = None,
) -> tuple[Answers, list[float]]:
    """Every question with evidence, asked one at a time (so latency is per call);
    `informal_seed`: each question as bench/informal.py rewrites it (typos, chat
    spellings) instead."""
    answers: Answers = []
    latencies: list[float] = []
    async with api.gateway(settings) as stub:
        for conv in conversations:
            for q in conv.questions:
                if not q.evidence:
                    continue
                question = (
                    q.question if informal_seed is None else informal(q.question, informal_seed)
                )
                request = memory_pb2.RecallRequest(
                    scope=memory_pb2.Scope(user_id=f"{prefix}{conv.sample_id}"),
                    query=question,
                    mode=api.MODES[mode],
                    top_k=top_k,
                )
                started = time.perf_counter()
                reply = await stub.Recall(
                    request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
                )
                latencies.append(time.perf_counter() - started)
                answers.append((conv.sample_id, q, [h.memory.client_id for h in reply.hits]))
    return answers, latencies


Answers = list[tuple[str, locomo.Question, list[str]]]  # (conversation, question, client ids)


def summarise(answers: Answers) -> dict[str, dict[int, float]]:
    """{group: {k: recall %}} for each category, "1-4", "all", and per conversation
    ("<sample_id>:1-4", "<sample_id>:all")."""
    groups: dict[str, list[tuple[locomo.Question, list[str]]]] = defaultdict(list)
    for conv, q, found in answers:
        groups[str(q.category)].append((q, found))
        groups["all"].append((q, found))
        groups[f"{conv}:all"].append((q, found))
        if q.category in (1, 2, 3, 4):
            groups["1-4"].append((q, found))
            groups[f"{conv}:1-4"].append((q, found))
    return {
        name: {k: 100 * statistics.fmean(recall_at(q.evidence, f, k) for q, f in rows) for k in KS}
        for name, rows in groups.items()
    }


def table(results: dict[str, Any], counts: dict[str, int]) -> str:
    head = "| mode | group | n | " + " | ".join(f"R@{k}" for k in KS) + " |"
    lines = [head, "|" + "---|" * (3 + len(KS))]
    order = ["1-4", "all", "1", "2", "3", "4", "5"]
    for mode in [m for m in (*MODES, *INFORMAL_MODES) if m in results]:
        per_conv = sorted(g for g in results[mode] if ":" in g) if mode == "hybrid" else []
        for group in order + per_conv:
            if group not in results[mode]:
                continue
            label = f"{group} {locomo.CATEGORIES[int(group)]}" if group.isdigit() else group
            cells = " | ".join(f"{results[mode][group][k]:.1f}" for k in KS)
            lines.append(f"| {mode} | {label} | {counts[group]} | {cells} |")
    dragon = " | ".join(f"{DRAGON[k]:.1f}" if k in DRAGON else "-" for k in KS)
    lines.append(f"| DRAGON (paper) | all | - | {dragon} |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode in MODES:
        ax.plot(KS, [results[mode]["all"][k] for k in KS], marker="o", label=f"{mode} (all)")
    ax.plot(list(DRAGON), list(DRAGON.values()), "k--", marker="s", label="DRAGON (paper)")
    ax.set_xlabel("k")
    ax.set_ylabel("evidence recall@k (%)")
    ax.set_title("LoCoMo evidence recall, all categories")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _turns_of(answers: Answers, parts: dict[str, str]) -> Answers:
    """Each hit as the turn it is part of (--chatty: a message of a split turn)."""
    return [(c, q, [parts.get(m, m) for m in found]) for c, q, found in answers]


async def measure(
    settings: CliSettings,
    data: Path,
    top_k: int,
    informal_seed: int | None = None,
    date_order: Order | None = None,
    chatty_seed: int | None = None,
) -> dict[str, Any]:
    conversations = locomo.load(data, date_order)
    parts: dict[str, str] = {}
    if chatty_seed is not None:
        conversations, parts = chatty(conversations, chatty_seed)
    prefix = f"bench-{uuid.uuid4().hex[:8]}-"  # never collides with an earlier run's users
    turns = sum(len(c.turns) for c in conversations)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # a fresh run: no progress to resume
        ledger = Ledger.open(Path(tmp) / "progress.json", prefix, restart=True)
        run = await replay_all(settings, conversations, ledger, user_prefix=prefix)
    created = run.created
    ingest_s = time.perf_counter() - started
    await asyncio.sleep(1.5)  # acknowledged writes are searchable within about a second
    results: dict[str, Any] = {}
    latency: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for mode in MODES:
        answers, seconds = await ask_all(settings, conversations, prefix, mode, top_k)
        results[mode] = summarise(_turns_of(answers, parts))
        latency[mode] = {
            "p50_ms": 1000 * percentile(seconds, 50),
            "p95_ms": 1000 * percentile(seconds, 95),
        }
        counts = {g: 0 for g in results[mode]}
        for conv, q, _ in answers:
            counts[str(q.category)] += 1
            counts["all"] += 1
            counts[f"{conv}:all"] += 1
            if q.category in (1, 2, 3, 4):
                counts["1-4"] += 1
                counts[f"{conv}:1-4"] += 1
    if informal_seed is not None:
        for mode in INFORMAL_MODES:
            answers, seconds = await ask_all(
                settings, conversations, prefix, mode.split()[0], top_k, informal_seed
            )
            results[mode] = summarise(_turns_of(answers, parts))
            latency[mode] = {
                "p50_ms": 1000 * percentile(seconds, 50),
                "p95_ms": 1000 * percentile(seconds, 95),
            }
    dropped = sum(1 for c in conversations for q in c.questions if not q.evidence)
    return {
        "data": str(data),
        "conversations": len(conversations),
        "turns": turns,
        "stored": created,
        "ingest_turns_per_s": turns / ingest_s,
        "questions": counts.get("all", 0),
        "questions_without_evidence": dropped,
        "recall": results,
        "counts": counts,
        "latency": latency,
    }


def private_run(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """`measure` on a private cluster (`hippo up` on free ports, a temporary data dir)."""
    with tempfile.TemporaryDirectory(prefix="hippo-bench-") as tmp:
        print(f"starting a private cluster {env} ...", file=sys.stderr)
        with local_cluster(Path(tmp), env) as cluster:
            settings = CliSettings(gateway_addr=cluster.gateway, timeout_seconds=30)
            report = asyncio.run(
                measure(
                    settings, args.data, args.top_k, args.informal, args.date_order, args.chatty
                )
            )
    report["settings"] = env
    return report


def show(report: dict[str, Any], args: argparse.Namespace, label: str) -> None:
    print(f"\nLoCoMo evidence recall@k (%): {report['data']} {label or report['settings'] or ''}")
    print(
        f"{report['conversations']} conversations, {report['turns']} turns, "
        f"{report['questions']} questions with evidence "
        f"({report['questions_without_evidence']} without, skipped)\n"
    )
    print(table(report["recall"], report["counts"]))
    print(f"\ningest: {report['ingest_turns_per_s']:.0f} turns/s (Remember, one call per session)")
    for mode, row in report["latency"].items():
        print(f"Recall {mode:<8} p50 {row['p50_ms']:.1f} ms  p95 {row['p95_ms']:.1f} ms")
    OUT.mkdir(parents=True, exist_ok=True)
    name = "recall_locomo.png" if not label else f"recall_locomo-{label.split('=')[-1]}.png"
    plot(report["recall"], OUT / name)
    print(f"\nplot: {OUT / name}")


def difference(report: dict[str, Any], base: dict[str, Any]) -> str:
    """Per mode and category: report's recall minus base's, in points."""
    head = "| mode | group | " + " | ".join(f"ΔR@{k}" for k in KS) + " |"
    lines = [head, "|" + "---|" * (2 + len(KS))]
    for mode in [m for m in (*MODES, *INFORMAL_MODES) if m in report["recall"]]:
        for group in ["1-4", "all", "1", "2", "3", "4", "5"]:
            if group not in report["recall"][mode]:
                continue
            now, then = report["recall"][mode][group], base["recall"][mode][group]
            cells = " | ".join(f"{now[k] - then[k]:+.1f}" for k in KS)
            lines.append(f"| {mode} | {group} | {cells} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo-format file")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--date-order",
        choices=ORDERS,
        help="how --data writes numeric day-month dates (as hippo replay's --date-order)",
    )
    parser.add_argument("--gateway", help="use this running gateway (host:port)")
    parser.add_argument("--api-key", help="API key for --gateway")
    parser.add_argument("--top-k", type=int, default=max(KS))
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for the private cluster, e.g. HIPPO_RETRIEVAL_RRF_K=5 (repeatable)",
    )
    parser.add_argument(
        "--compare",
        metavar="KEY=A,B",
        help="measure one private cluster per value of this setting, side by side",
    )
    parser.add_argument(
        "--informal",
        type=int,
        metavar="SEED",
        help="also ask every question rewritten informally, with typos (bench/informal.py)",
    )
    parser.add_argument(
        "--chatty",
        type=int,
        metavar="SEED",
        help="store the conversations as people chat: a message per sentence, fillers, "
        "typos (bench/chatty.py)",
    )
    args = parser.parse_args()
    # Every Recall pays for its query's embedding: the questions repeat across modes, and
    # with the cache on the later modes would look faster than they are.
    extra_env = {"HIPPO_EMBEDDING_CACHE_ENTRIES": "0"}
    extra_env.update(item.split("=", 1) for item in args.env)
    if not args.data.exists():
        parser.error(f"{args.data} not found (pass --data FILE)")

    if args.compare:
        if args.gateway:
            parser.error("--compare starts its own clusters: leave out --gateway")
        key, _, values = args.compare.partition("=")
        if not key or "," not in values:
            parser.error("--compare takes KEY=A,B (two values or more)")
        reports = {}
        for value in values.split(","):
            reports[value] = private_run(args, {**extra_env, key: value})
            show(reports[value], args, f"{key}={value}")
        first = next(iter(reports))
        for value, report in list(reports.items())[1:]:
            print(f"\n{key}={value} minus {key}={first} (recall points):\n")
            print(difference(report, reports[first]))
        if args.json:
            args.json.write_text(json.dumps(reports, indent=1))
            print(f"figures: {args.json}")
        return 0
    if args.gateway:
        settings = CliSettings(
            gateway_addr=args.gateway, api_key=args.api_key or "", timeout_seconds=30
        )
        report = asyncio.run(
            measure(settings, args.data, args.top_k, args.informal, args.date_order, args.chatty)
        )
        report["settings"] = extra_env
    else:
        report = private_run(args, extra_env)
    show(report, args, "")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
