"""Memories as stored, attendable key/value states vs the same memories as prompt text
(issue 20, first part: the engine's stored states, before the memtok store keeps them).

Gemma 3 270M in process, the facts and neutral questions of bench/data (the injection
sweep's), each question in the completion format ("Question: ...\\nAnswer:"). Arms:

  zero     the question alone;
  text     the fact quoted before the question in the prompt;
  read     the fact as attendable positions read at request time (`Attendable.texts`);
  stored   the fact's key/value states computed once beforehand (`Engine.memory_states`)
           and attached at request time (`Attendable.states`): the route the store will
           take. Values from --from-layer up (the sweep's best: 6), x --scale;
  and text / stored again with each fact rewritten informally, with typos (`hard`,
  the influence bench's rule), as a user would write it.

Measured, one teacher-forced pass per probe and arm (reruns agree exactly):
  gain     mean log p(answer) minus the zero arm's (nats), over the facts;
  match    greedy exact match of the answer;
  damage   on neutral questions, each with an unrelated fact attached the arm's way: the
           mean drop in log p(correct answer) vs zero (nats; > 0 is damage);
  ttft     median time to first token (prefill) with 1, 5 and 10 memories (the fact
           first, then other facts), and the prompt tokens the model reads for it;
  bytes    of one memory's states (float16), and the time to compute them once.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/attendable_store.py [--limit N] [--from-layer 6]

Writes bench/out/attendable_store.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from influence_eval import hard
from injection_sweep import Cell, Probe, Sweep, _cell, _load, _prompt, prefill

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
COUNTS = (1, 5, 10)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--from-layer", type=int, default=6)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--limit", type=int, default=0, help="the first N facts only (0: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="prefills per latency cell")
    parser.add_argument("--model-dir", default=str(ROOT / "var" / "injection" / "model"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from hippo_injection.adapters import loader
    from hippo_injection.adapters.engine import TransformersEngine
    from hippo_injection.domain.types import Attendable

    torch.manual_seed(0)
    started = time.perf_counter()
    engine = TransformersEngine.load(
        loader.ensure_cached(Path(args.model_dir)), "float32", "cpu", args.threads
    )
    facts = _load("injection_facts.jsonl")
    neutral = _load("injection_neutral.jsonl")
    if args.limit:
        facts = facts[: args.limit]
    sweep = Sweep(engine, facts, neutral)
    layer, scale = args.from_layer, args.scale
    informal = {p.id: hard(p.fact, i) for i, p in enumerate(facts)}
    print(
        f"# Gemma 3 270M (float32, {torch.get_num_threads()} threads): {len(facts)} facts, "
        f"{len(neutral)} neutral questions; memories from layer {layer}, x{scale:g}",
        file=sys.stderr,
        flush=True,
    )

    # Each memory's states, computed once (what the store would do at write time).
    computing: list[float] = []
    states: dict[str, Any] = {}
    for text in [p.fact for p in facts] + list(informal.values()):
        if text not in states:
            began = time.perf_counter()
            states[text] = engine.memory_states(text, layer)
            computing.append(time.perf_counter() - began)
    sizes = [states[p.fact].nbytes for p in facts]
    tokens = [states[p.fact].tokens for p in facts]

    def read(texts: list[str]) -> Any:
        return Attendable(tuple(texts), from_layer=layer, value_scale=scale)

    def stored(texts: list[str]) -> Any:
        return Attendable(
            from_layer=layer, value_scale=scale, states=tuple(states[t] for t in texts)
        )

    def text_arm(fact_of: Any) -> Cell:
        return _cell(
            sweep,
            zero,
            lambda i, p: sweep.score(Probe(p.id, p.question, p.answer, fact_of(p)), [], text=True),
            lambda i, p: sweep.score(
                Probe(p.id, p.question, p.answer, sweep.partner(i).fact), [], text=True
            ),
        )

    def attend_arm(make: Any, fact_of: Any) -> Cell:
        return _cell(
            sweep,
            zero,
            lambda i, p: sweep.score(p, [], make([fact_of(p)])),
            lambda i, p: sweep.score(p, [], make([sweep.partner(i).fact])),
        )

    zero = {p.id: sweep.score(p, [])[0] for p in facts + neutral}
    cells = {
        "zero": _cell(
            sweep, zero, lambda i, p: sweep.score(p, []), lambda i, p: sweep.score(p, [])
        ),
        "text": text_arm(lambda p: p.fact),
        "read": attend_arm(read, lambda p: p.fact),
        "stored": attend_arm(stored, lambda p: p.fact),
        "text, informal facts": text_arm(lambda p: informal[p.id]),
        "stored, informal facts": attend_arm(stored, lambda p: informal[p.id]),
    }

    # Time to first token: the question after 1, 5 or 10 memories (the fact, then others).
    latency: dict[str, dict[int, tuple[float, float]]] = {"text": {}, "read": {}, "stored": {}}
    for count in COUNTS:
        samples: dict[str, list[float]] = {arm: [] for arm in latency}
        prompt_tokens: dict[str, list[int]] = {arm: [] for arm in latency}
        for i, p in enumerate(facts[: args.repeats]):
            memories = [p.fact] + [facts[(i + j) % len(facts)].fact for j in range(1, count)]
            question = [engine.bos_id, *engine.tokenize(_prompt(p.question))]
            quoted = [engine.bos_id, *engine.tokenize(_prompt(p.question, "\n".join(memories)))]
            for arm, ids, attendable in (
                ("text", quoted, Attendable()),
                ("read", question, read(memories)),
                ("stored", question, stored(memories)),
            ):
                prefill(engine, ids, attendable)  # warm
                samples[arm].append(prefill(engine, ids, attendable))
                prompt_tokens[arm].append(len(ids))
        for arm in latency:
            latency[arm][count] = (
                1000 * statistics.median(samples[arm]),
                statistics.fmean(prompt_tokens[arm]),
            )

    print(f"\n{len(facts)} facts, {len(neutral)} neutral questions; memories from layer {layer}")
    print("\n| arm | gain (nats) | exact match | damage (nats) | neutral match |")
    print("|---|---|---|---|---|")
    for name, cell in cells.items():
        print(
            f"| {name} | {cell.gain:+.2f} | {cell.match:.0%} | {cell.damage:+.2f} | "
            f"{cell.neutral_match:.0%} |"
        )
    share = cells["stored"].gain / cells["text"].gain if cells["text"].gain else float("nan")
    print(f"\nstored reaches {share:.0%} of the text arm's gain (target >= 90%)")
    print(
        "\n| memories | text ttft ms (prompt tokens) | read ttft ms "
        "| stored ttft ms (prompt tokens) |"
    )
    print("|---|---|---|---|")
    for count in COUNTS:
        t, r, s = (latency[arm][count] for arm in ("text", "read", "stored"))
        print(f"| {count} | {t[0]:.1f} ({t[1]:.0f}) | {r[0]:.1f} | {s[0]:.1f} ({s[1]:.0f}) |")
    size, length = statistics.fmean(sizes), statistics.fmean(tokens)
    print(
        f"\nstates per memory (float16): {size / 1024:.0f} KiB mean ({length:.1f} tokens; "
        f"{size / length / 1024:.1f} KiB per token); computed once in "
        f"{1000 * statistics.median(computing):.0f} ms median"
    )
    print(f"wall {time.perf_counter() - started:.0f} s", file=sys.stderr)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "attendable_store.json").write_text(
        json.dumps(
            {
                "from_layer": layer,
                "scale": scale,
                "facts": len(facts),
                "cells": {k: v.__dict__ for k, v in cells.items()},
                "ttft_ms": {arm: {str(c): v for c, v in d.items()} for arm, d in latency.items()},
                "bytes_per_memory": statistics.fmean(sizes),
                "tokens_per_memory": statistics.fmean(tokens),
                "compute_ms": 1000 * statistics.median(computing),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
