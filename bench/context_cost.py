"""What a bounded, boundary-weighted context costs, against resending the whole history.

Replays one LoCoMo-format conversation as a chat, turn by turn, through the running Memory
API (speaker_a is the app's user). Before each user turn it measures the input tokens:
- naive: every earlier turn plus this one, as chat messages (what a stateless app sends),
- Hippo: the prompt BuildContext assembles, at budgets of 1k, 2k and 4k tokens,
all counted with the serving model's own tokenizer and chat format. Then every QA question
of the conversation is asked at the end (in its last session): is its evidence in the
built context (verbatim among the memories or the window, or its facts in the summary)?
That rate is compared with hybrid recall@10 on the same questions. The summariser's fact
retention (before and after its validation) is read from the sessions' merge statistics.

    .venv/bin/python bench/context_cost.py [--data FILE] [--conversation conv-26] [--turns N]

It starts a private cluster (summaries are written by the local 270M model on the CPU,
which is slow: a whole conversation takes a while; --turns limits the replay).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
from hippo.memory.v1 import memory_pb2
from hippo.summariser.v1 import summariser_pb2, summariser_pb2_grpc
from hippo_cli import api, locomo
from hippo_cli.cluster import local_cluster
from hippo_cli.replay import memory_turn
from hippo_cli.settings import CliSettings
from hippo_core import client

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
OUT = ROOT / "bench" / "out"
TENANT = "local"  # the tenant `hippo up` gives the CLI's key
IN_CONTEXT = (memory_pb2.ZONE_KIND_MEMORIES, memory_pb2.ZONE_KIND_WINDOW)
# What a summary must keep of a turn for its facts to count as in context: numbers, and
# capitalised words that are not the first word of a sentence (names, places, titles).
_NUMBER = re.compile(r"\b\d[\d.,:/-]*\b")
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+\b")


def facts(text: str) -> set[str]:
    return {m.group(0).lower() for m in _NUMBER.finditer(text)} | {
        m.group(0).lower() for m in _NAME.finditer(text)
    }


def chat_role(turn: locomo.Turn, conv: locomo.Conversation) -> injection_pb2.Role:
    first = turn.speaker == conv.speaker_a
    return injection_pb2.ROLE_USER if first else injection_pb2.ROLE_ASSISTANT


async def naive_tokens(
    tokenizer: injection_pb2_grpc.InjectionServiceStub,
    history: list[locomo.Turn],
    query: locomo.Turn,
    conv: locomo.Conversation,
) -> int:
    """The whole conversation so far, resent as chat messages (neighbours of one role
    joined, as a chat format needs), then the new message."""
    messages: list[injection_pb2.ChatMessage] = []
    for turn in [*history, query]:
        role = chat_role(turn, conv)
        if messages and messages[-1].role == role:
            messages[-1].content += "\n\n" + turn.text
        else:
            messages.append(injection_pb2.ChatMessage(role=role, content=turn.text))
    if messages and messages[0].role == injection_pb2.ROLE_ASSISTANT:
        messages.insert(0, injection_pb2.ChatMessage(role=injection_pb2.ROLE_USER, content="(hi)"))
    reply = await tokenizer.CountTokens(
        injection_pb2.CountTokensRequest(messages=messages), timeout=60
    )
    return int(reply.tokens)


async def run(
    settings: CliSettings,
    addrs: dict[str, str],
    conv: locomo.Conversation,
    budgets: list[int],
    turns: int,
) -> dict[str, Any]:
    user = f"ctx-{uuid.uuid4().hex[:6]}-{conv.sample_id}"
    history: list[locomo.Turn] = []
    ids: dict[str, str] = {}  # dia_id -> memory id
    rows: list[dict[str, Any]] = []
    replay = list(conv.turns[:turns] if turns else conv.turns)
    meta = api.metadata(settings)
    async with (
        api.gateway(settings) as stub,
        client.channel(addrs["injection"]) as llm_channel,
        client.channel(addrs["summariser"]) as summariser_channel,
    ):
        tokenizer = injection_pb2_grpc.InjectionServiceStub(llm_channel)
        summariser = summariser_pb2_grpc.SummariserServiceStub(summariser_channel)
        started = time.perf_counter()
        for n, turn in enumerate(replay):
            session = f"session_{turn.session}"
            scope = memory_pb2.Scope(user_id=user, session_id=session)
            if turn.speaker == conv.speaker_a:
                row: dict[str, Any] = {
                    "turn": n,
                    "naive": await naive_tokens(tokenizer, history, turn, conv),
                }
                for budget in budgets:
                    built = await stub.BuildContext(
                        memory_pb2.BuildContextRequest(
                            scope=scope, query=turn.text, token_budget=budget
                        ),
                        metadata=meta,
                        timeout=120,
                    )
                    row[str(budget)] = built.tokens.total
                rows.append(row)
            reply = await stub.Remember(
                memory_pb2.RememberRequest(
                    scope=scope, turns=[memory_turn(turn, conv)], wait_searchable=True
                ),
                metadata=meta,
                timeout=120,
            )
            ids[turn.dia_id] = reply.memory_ids[0]
            history.append(turn)
            if n % 25 == 0:
                took = time.perf_counter() - started
                print(f"  turn {n}/{len(replay)} ({took:.0f} s)", file=sys.stderr)

        # Let the summariser finish merging (the local model is slow on a CPU).
        sessions = sorted({t.session for t in replay})
        stats = []
        for s in sessions:
            flushed = await summariser.Flush(
                summariser_pb2.FlushRequest(tenant=TENANT, user_id=user, session_id=f"session_{s}"),
                timeout=3600,
            )
            stats.append(flushed.session.merge_stats)
        last_session = f"session_{sessions[-1]}"
        by_turn = {t.dia_id: t for t in replay}

        qa: dict[str, list[float]] = {str(b): [] for b in budgets}
        qa["recall@10"] = []
        scope = memory_pb2.Scope(user_id=user, session_id=last_session)
        for q in conv.questions:
            evidence = [e for e in q.evidence if e in ids]
            if not evidence:
                continue
            recalled = await stub.Recall(
                memory_pb2.RecallRequest(
                    scope=memory_pb2.Scope(user_id=user), query=q.question, top_k=10
                ),
                metadata=meta,
                timeout=60,
            )
            found = {h.memory.memory_id for h in recalled.hits}
            qa["recall@10"].append(sum(ids[e] in found for e in evidence) / len(evidence))
            for budget in budgets:
                built = await stub.BuildContext(
                    memory_pb2.BuildContextRequest(
                        scope=scope, query=q.question, token_budget=budget
                    ),
                    metadata=meta,
                    timeout=120,
                )
                verbatim = {m for z in built.zones if z.kind in IN_CONTEXT for m in z.memory_ids}
                summary = facts(built.summary)
                held = [
                    ids[e] in verbatim
                    or (bool(facts(by_turn[e].text)) and facts(by_turn[e].text) <= summary)
                    for e in evidence
                ]
                qa[str(budget)].append(sum(held) / len(evidence))

    totals = {key: sum(r[key] for r in rows) for key in ["naive", *map(str, budgets)]}
    merged = {
        "merges": sum(s.merges for s in stats),
        "turns_merged": sum(s.turns_merged for s in stats),
        "facts": sum(s.facts for s in stats),
        "retention_llm": sum(s.facts_kept_llm for s in stats) / max(1, sum(s.facts for s in stats)),
        "retention": sum(s.facts_kept for s in stats) / max(1, sum(s.facts for s in stats)),
        "llm_failures": sum(s.llm_failures for s in stats),
    }
    return {
        "conversation": conv.sample_id,
        "turns_replayed": len(replay),
        "user_turns": len(rows),
        "rows": rows,
        "totals": totals,
        "ratio": {b: totals["naive"] / max(1, totals[str(b)]) for b in budgets},
        "evidence_in_context": {k: 100 * statistics.fmean(v) if v else 0.0 for k, v in qa.items()},
        "questions": len(qa["recall@10"]),
        "summaries": merged,
    }


def plot(report: dict[str, Any], budgets: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [r["turn"] for r in report["rows"]]
    ax.plot(xs, [r["naive"] for r in report["rows"]], label="naive: the whole history")
    for budget in budgets:
        ax.plot(
            xs, [r[str(budget)] for r in report["rows"]], label=f"BuildContext, budget {budget}"
        )
    ax.set_xlabel("turn of the conversation")
    ax.set_ylabel("input tokens per user turn")
    ax.set_title(f"Input tokens per turn, {report['conversation']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--conversation", help="sample_id (default: the first)")
    parser.add_argument("--budgets", default="1024,2048,4096")
    parser.add_argument("--turns", type=int, default=0, help="replay only the first N turns")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    convs = locomo.load(args.data)
    conv = (
        next((c for c in convs if c.sample_id == args.conversation), None)
        if args.conversation
        else convs[0]
    )
    if conv is None:
        parser.error(f"no conversation {args.conversation!r} in {args.data}")
    budgets = [int(b) for b in args.budgets.split(",")]
    with (
        tempfile.TemporaryDirectory(prefix="hippo-context-") as tmp,
        local_cluster(Path(tmp)) as cluster,
    ):
        settings = CliSettings(gateway_addr=cluster.gateway, timeout_seconds=120)
        report = asyncio.run(run(settings, cluster.addrs, conv, budgets, args.turns))

    t = report["totals"]
    head = f"{report['turns_replayed']} turns, {report['user_turns']} user turns"
    print(f"\n{report['conversation']}: {head}")
    print("\n| input tokens | naive | " + " | ".join(f"budget {b}" for b in budgets) + " |")
    print("|---|---|" + "---|" * len(budgets))
    print(
        f"| total over the conversation | {t['naive']} | "
        + " | ".join(str(t[str(b)]) for b in budgets)
        + " |"
    )
    print(
        "| naive / Hippo | 1.0 | "
        + " | ".join(f"{report['ratio'][b]:.1f}x" for b in budgets)
        + " |"
    )
    last = report["rows"][-1] if report["rows"] else {}
    print(
        f"| last user turn | {last.get('naive')} | "
        + " | ".join(str(last.get(str(b))) for b in budgets)
        + " |"
    )
    e = report["evidence_in_context"]
    print(
        f"\nevidence in context ({report['questions']} questions): "
        + ", ".join(f"budget {b}: {e[str(b)]:.1f}%" for b in budgets)
        + f"; hybrid recall@10: {e['recall@10']:.1f}%"
    )
    s = report["summaries"]
    print(
        f"summaries: {s['merges']} merges of {s['turns_merged']} turns, {s['facts']} facts; "
        f"retention {100 * s['retention_llm']:.1f}% before validation, "
        f"{100 * s['retention']:.1f}% after; {s['llm_failures']} LLM failures retried"
    )
    OUT.mkdir(parents=True, exist_ok=True)
    plot(report, budgets, OUT / "context_cost.png")
    print(f"plot: {OUT / 'context_cost.png'}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
