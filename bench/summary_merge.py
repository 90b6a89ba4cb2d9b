"""Rolling-summary merges on the real local model: latency and fact retention.

Replays a LoCoMo conversation turn by turn through the summariser's Append (speaker_a as
the user, speaker_b as the assistant, one Append per turn, as a chat would), with a real
injection service counting tokens and serving the merge LLM (Gemma 3 270M base) over its
TGI-compatible API. Then waits for the last merge (Flush) and reports, per merge style:

  merges, merge latency (p50 / p90 / max, from the service's `merged` log events), LLM
  calls per merge, fact retention before validation (the LLM's first answer) and after
  (the committed summary), sentences removed as invented, the summary's size, Append
  latency, and how far the window overshot its budget while merges were pending.
  `--pace flush` (default) sends each turn once the previous merges committed (a chat
  whose replies take longer than a merge); `--pace burst` sends turns back to back and
  shows the backlog (merges then take up to MERGE_INPUT_TOKENS of turns at a time).

`--mode` compares the merge modes (docs/sessions.md#merge-modes): `llm` (the styles
above), `extractive` (no LLM), or `both`. The LLM arm is slow on a CPU, so it replays the
first `--llm-turns` turns; the extractive arm replays `--turns` (0 = the whole
conversation) and, with `both`, the LLM arm's turns too, for a like-for-like row. Each
row also says how much of the QA evidence the final context still holds: a question's
evidence turn is held when it is still in the window, or when its facts (numbers and
names, as bench/context_cost.py judges them) are all in the summary; "merged evidence"
counts only the evidence turns that were merged into the summary.

Also measures what a token count costs: CountTokens over gRPC per turn vs loading the
same tokenizer.json in-process (load time, RSS, per-turn time).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/summary_merge.py [--mode both] \
        [--turns 0] [--llm-turns 80] [--styles rewrite,extend] [--pace flush|burst] \
        [--window 1024] [--summary 256] [--json out.json] [--show-summary]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from context_cost import facts as evidence_facts  # bench/ is the script's directory

from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
from hippo.memory.v1 import memory_pb2
from hippo.summariser.v1 import summariser_pb2 as pb
from hippo.summariser.v1 import summariser_pb2_grpc
from hippo_cli import locomo
from hippo_core.listen import reserve_port
from hippo_core.testing import (
    ServiceProcess,
    metric,
    scrape,
    service_process,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "var" / "injection" / "model"
DATA = Path("/work/shared/data/locomo-dev.json")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def turns_of(conversation: locomo.Conversation, limit: int) -> list[pb.SessionTurn]:
    out = []
    for t in conversation.turns[:limit]:
        text = t.text + (f" [shares a photo: {t.caption}]" if t.caption else "")
        out.append(
            pb.SessionTurn(
                memory_id=f"{conversation.sample_id}:{t.dia_id}",
                role=memory_pb2.ROLE_USER
                if t.speaker == conversation.speaker_a
                else memory_pb2.ROLE_ASSISTANT,
                text=text,
                time_us=t.time_us,
                speaker=t.speaker,
            )
        )
    return out


def merged_events(proc: ServiceProcess) -> list[dict[str, Any]]:
    events = []
    for line in proc.log_text().splitlines():
        if line.startswith("{") and '"event": "merged"' in line:
            events.append(json.loads(line))
    return events


def evidence(
    conversation: locomo.Conversation, replayed: int, state: pb.GetSessionResponse
) -> dict[str, float]:
    """Share of the QA evidence (questions whose evidence turns were all replayed) the
    final context holds: in the window verbatim, or its facts all in the summary."""
    turns = {t.dia_id: t for t in conversation.turns[:replayed]}
    window = {t.memory_id.split(":", 1)[1] for t in state.window}
    summary = evidence_facts(state.summary)

    def in_summary(dia_id: str) -> bool:
        found = evidence_facts(turns[dia_id].text)
        return bool(found) and found <= summary

    held: list[float] = []
    merged: list[float] = []
    for q in conversation.questions:
        if not q.evidence or not all(e in turns for e in q.evidence):
            continue
        held.append(statistics.fmean(e in window or in_summary(e) for e in q.evidence))
        gone = [e for e in q.evidence if e not in window]
        if gone:
            merged.append(statistics.fmean(in_summary(e) for e in gone))
    return {
        "questions": len(held),
        "evidence_in_context": statistics.fmean(held) if held else float("nan"),
        "merged_questions": len(merged),
        "merged_evidence_in_summary": statistics.fmean(merged) if merged else float("nan"),
    }


def replay(
    mode: str,
    style: str,
    turns: list[pb.SessionTurn],
    injection: ServiceProcess,
    http: str,
    args: Any,
) -> dict[str, Any]:
    name = f"{mode}-{style}-{len(turns)}" if mode == "llm" else f"{mode}-{len(turns)}"
    data = Path(tempfile.mkdtemp(prefix=f"summary-bench-{name}-"))
    env = {
        "HIPPO_SUMMARISER_DATA_DIR": str(data),
        "HIPPO_SUMMARISER_INJECTION_ADDR": injection.addr,
        "HIPPO_SUMMARISER_LLM_URL": http,
        "HIPPO_SUMMARISER_WINDOW_TOKENS": str(args.window),
        "HIPPO_SUMMARISER_SUMMARY_TOKENS": str(args.summary),
        "HIPPO_SUMMARISER_MERGE_STYLE": style,
        "HIPPO_SUMMARISER_MERGE_MODE": mode,
        "HIPPO_SUMMARISER_LLM_TIMEOUT_SECONDS": "600",
    }
    with service_process("hippo_summariser", "HIPPO_SUMMARISER_", env) as proc:
        wait_for(proc.addr, "hippo.summariser.v1.SummariserService", timeout=60)
        stub = summariser_pb2_grpc.SummariserServiceStub(grpc.insecure_channel(proc.addr))
        scope = {"tenant": "bench", "user_id": "u", "session_id": name}
        append_ms: list[float] = []
        overshoot: list[int] = []
        started = time.perf_counter()
        for i, turn in enumerate(turns):
            t0 = time.perf_counter()
            stub.Append(pb.AppendRequest(**scope, turns=[turn]), timeout=30)
            append_ms.append((time.perf_counter() - t0) * 1000)
            if args.pace == "flush":
                # The next turn arrives once merges have caught up, as in a chat where
                # each reply takes longer than a merge; "burst" sends turns back to back.
                state = stub.Flush(pb.FlushRequest(**scope), timeout=args.flush_timeout).session
            else:
                state = stub.GetSession(pb.GetSessionRequest(**scope), timeout=10)
            overshoot.append(state.window_tokens)
            if (i + 1) % 20 == 0:
                print(
                    f"  [{name}] {i + 1}/{len(turns)} turns, {state.merge_stats.merges} merges, "
                    f"window {state.window_tokens} tokens",
                    flush=True,
                )
        state = stub.Flush(pb.FlushRequest(**scope), timeout=args.flush_timeout).session
        replay_s = time.perf_counter() - started
        samples = scrape(proc.metrics_url)
        events = merged_events(proc)
    stats = state.merge_stats
    seconds = [float(e["seconds"]) for e in events]
    return {
        "mode": mode,
        "style": style if mode == "llm" else "-",
        "turns": len(turns),
        "merges": stats.merges,
        "turns_merged": stats.turns_merged,
        "merge_pending_at_end": state.merge_pending,
        "merge_seconds_p50": pct(seconds, 0.5),
        "merge_seconds_p90": pct(seconds, 0.9),
        "merge_seconds_max": max(seconds, default=float("nan")),
        "llm_calls_per_merge": statistics.mean(int(e["llm_calls"]) for e in events)
        if events
        else float("nan"),
        "facts": stats.facts,
        "retention_llm": stats.facts_kept_llm / stats.facts if stats.facts else 1.0,
        "retention_final": stats.facts_kept / stats.facts if stats.facts else 1.0,
        "invented_sentences_removed": metric(
            samples, "hippo_summariser_repairs_total", kind="invented_sentence"
        ),
        "strict_retries": metric(samples, "hippo_summariser_repairs_total", kind="strict_retry"),
        "facts_sentences": metric(samples, "hippo_summariser_repairs_total", kind="facts_sentence"),
        "summary_tokens": state.summary_tokens,
        "summary": state.summary,
        "window_tokens_end": state.window_tokens,
        "window_tokens_max": max(overshoot, default=0),
        "append_ms_p50": pct(append_ms, 0.5),
        "append_ms_p90": pct(append_ms, 0.9),
        "replay_seconds": replay_s,
        **evidence(args.conversation, len(turns), state),
    }


def count_cost(injection: ServiceProcess, turns: list[pb.SessionTurn]) -> dict[str, float]:
    """A turn's token count over gRPC vs the same tokenizer loaded in-process."""
    lines = [
        f"<start_of_turn>{'user' if t.role == memory_pb2.ROLE_USER else 'model'}\n"
        f"{t.text}<end_of_turn>\n"
        for t in turns
    ]
    with grpc.insecure_channel(injection.addr) as channel:
        stub = injection_pb2_grpc.InjectionServiceStub(channel)
        stub.CountTokens(injection_pb2.CountTokensRequest(text="warm up"), timeout=10)
        t0 = time.perf_counter()
        remote = [
            stub.CountTokens(injection_pb2.CountTokensRequest(text=x), timeout=10).tokens - 1
            for x in lines
        ]
        grpc_ms = (time.perf_counter() - t0) * 1000 / len(lines)
    from tokenizers import Tokenizer

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    path = next(MODEL_DIR.glob("*/tokenizer.json"))
    tokenizer = Tokenizer.from_file(str(path))
    load_s = time.perf_counter() - t0
    rss_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    t0 = time.perf_counter()
    local = [len(tokenizer.encode(x, add_special_tokens=False).ids) for x in lines]
    local_ms = (time.perf_counter() - t0) * 1000 / len(lines)
    return {
        "turns": len(lines),
        "grpc_ms_per_turn": grpc_ms,
        "local_ms_per_turn": local_ms,
        "local_load_seconds": load_s,
        "local_rss_mb": rss_mb,
        "counts_agree": float(remote == local),
        "window_sum_equals_joined": float(
            sum(local) == len(tokenizer.encode("".join(lines), add_special_tokens=False).ids)
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--sample", type=int, default=0, help="which conversation")
    parser.add_argument(
        "--mode", choices=["llm", "extractive", "both"], default="both", help="merge modes"
    )
    parser.add_argument(
        "--turns", type=int, default=0, help="turns the extractive arm replays (0 = all)"
    )
    parser.add_argument(
        "--llm-turns", type=int, default=80, help="turns the LLM arm replays (0 = all)"
    )
    parser.add_argument("--styles", default="rewrite,extend", help="LLM arm's merge styles")
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--summary", type=int, default=256)
    parser.add_argument(
        "--pace",
        choices=["flush", "burst"],
        default="flush",
        help="flush: each turn after the previous merges committed; burst: back to back",
    )
    parser.add_argument("--flush-timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "out" / "summary_merge.json")
    parser.add_argument("--show-summary", action="store_true")
    args = parser.parse_args()

    conversation = locomo.load(args.data)[args.sample]
    args.conversation = conversation
    every = len(conversation.turns)
    arms: list[tuple[str, str, int]] = []  # (mode, style, turns)
    llm_turns = min(args.llm_turns or every, every)
    if args.mode in ("llm", "both"):
        arms += [("llm", style, llm_turns) for style in args.styles.split(",")]
    if args.mode in ("extractive", "both"):
        sizes = [min(args.turns or every, every)]
        if args.mode == "both" and llm_turns not in sizes:
            sizes.insert(0, llm_turns)
        arms += [("extractive", "rewrite", n) for n in sizes]
    turns = turns_of(conversation, max(n for _, _, n in arms))
    http_port = reserve_port()
    env = {
        "HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR),
        "HIPPO_INJECTION_HTTP_PORT": str(http_port),
    }
    print(
        f"LoCoMo {conversation.sample_id}: {len(turns)} of {every} turns, window "
        f"{args.window}, summary {args.summary} tokens, pace {args.pace}; arms: "
        + ", ".join(f"{m}{'/' + s if m == 'llm' else ''} x{n}" for m, s, n in arms),
        flush=True,
    )
    results: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items() if k != "conversation"}
    }
    with service_process("hippo_injection", "HIPPO_INJECTION_", env) as injection:
        wait_for(injection.addr, "hippo.injection.v1.InjectionService", timeout=300)
        results["count_cost"] = count_cost(injection, turns)
        results["runs"] = [
            replay(mode, style, turns[:n], injection, f"http://127.0.0.1:{http_port}", args)
            for mode, style, n in arms
        ]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))

    c = results["count_cost"]
    print(
        f"\nToken counting ({c['turns']} turns): CountTokens over gRPC "
        f"{c['grpc_ms_per_turn']:.2f} ms/turn; tokenizer.json in-process "
        f"{c['local_ms_per_turn']:.3f} ms/turn after {c['local_load_seconds']:.1f} s load and "
        f"+{c['local_rss_mb']:.0f} MB RSS; counts agree: {bool(c['counts_agree'])}; "
        f"per-turn counts sum to the joined window's: {bool(c['window_sum_equals_joined'])}\n"
    )
    header = (
        "| mode | style | turns | merges | merge s p50 / p90 / max | LLM calls/merge | facts "
        "| retention before → after | invented sentences removed | summary tokens | window "
        "max | evidence in context (questions) | merged evidence in summary (questions) | "
        "Append ms p50 | replay s |"
    )
    print(header)
    print("|---" * 15 + "|")
    for r in results["runs"]:
        print(
            f"| {r['mode']} | {r['style']} | {r['turns']} | {r['merges']} | "
            f"{r['merge_seconds_p50']:.3f} / {r['merge_seconds_p90']:.3f} / "
            f"{r['merge_seconds_max']:.3f} | {r['llm_calls_per_merge']:.2f} | {r['facts']} | "
            f"{r['retention_llm']:.1%} → {r['retention_final']:.1%} | "
            f"{r['invented_sentences_removed']:.0f} | {r['summary_tokens']} | "
            f"{r['window_tokens_max']} | {r['evidence_in_context']:.1%} ({r['questions']}) | "
            f"{r['merged_evidence_in_summary']:.1%} ({r['merged_questions']}) | "
            f"{r['append_ms_p50']:.1f} | {r['replay_seconds']:.0f} |"
        )
    if args.show_summary:
        for r in results["runs"]:
            print(f"\n[{r['mode']} {r['style']} x{r['turns']}] summary:\n{r['summary']}")
    print(f"\n(json: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
