"""Does residual-stream injection make Gemma 3 270M use a fact? Layer x strength sweep.

Four arms, each probe question asked in the completion format the base model answers
best ("Question: ...\\nAnswer:"):
  zero        the question alone;
  residual    the fact's value vector added at one layer's output, every position;
  attendable  the fact as extra attendable positions (its own key/value states before
              the prompt in the cache), values zeroed below `from_layer`, scaled above;
  text        the fact as text at the start of the prompt.
The value vector is the fact's mean hidden state at the layer minus the mean over the
service's neutral statements (ActAdd/CAA), rescaled to the layer's mean hidden-state
norm, so a strength of 1.0 adds as much as a typical hidden state holds there.

Measured, from one teacher-forced pass per probe and setting (so reruns agree exactly):
  gain    mean log p(expected answer) minus the zero arm's, over the facts (nats);
  match   greedy exact match: every answer token is the argmax (greedy decoding would
          write the answer);
  damage  on neutral questions no fact touches, with a fact's influence applied: the
          mean drop in log p(correct answer) vs zero (nats; > 0 is damage), and how
          often greedy still gives the correct answer;
  latency time to first token and per token for a short greedy reply, per arm.

Output: a table on stdout, bench/out/injection_gain.png and injection_damage.png (layer x
strength per injection arm), bench/out/injection_sweep.json. Default grid finishes in
about 15-20 minutes on 2 CPU cores; --layers/--strengths/--limit change it.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/injection_sweep.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data"
OUT = ROOT / "bench" / "out"


@dataclass(frozen=True)
class Probe:
    id: str
    question: str
    answer: str
    fact: str = ""
    kind: str = "neutral"


def _load(name: str) -> list[Probe]:
    rows = [json.loads(line) for line in (DATA / name).read_text().splitlines() if line]
    return [Probe(**row) for row in rows]


def _prompt(question: str, fact: str = "") -> str:
    head = f"{fact}\n" if fact else ""
    return f"{head}Question: {question}\nAnswer:"


@dataclass
class Cell:
    gain: float  # mean Δ log p over facts vs zero
    match: float  # greedy exact-match rate over facts
    damage: float  # mean drop of log p on neutral questions vs zero
    neutral_match: float  # greedy exact-match rate on neutral questions

    def row(self) -> str:
        return f"{self.gain:+7.2f} {self.match:6.0%} {self.damage:+7.2f} {self.neutral_match:6.0%}"


class Sweep:
    def __init__(self, engine: Any, facts: list[Probe], neutral: list[Probe]) -> None:
        from hippo_injection.domain.types import Attendable

        self.engine = engine
        self.facts = facts
        self.neutral = neutral
        self.no_memory = Attendable()
        self._ids = {
            p.id: [engine.bos_id, *engine.tokenize(_prompt(p.question))] for p in facts + neutral
        }
        self._answer = {p.id: engine.tokenize(" " + p.answer) for p in facts + neutral}
        self.passes = 0

    def score(
        self, probe: Probe, influences: list[Any], attendable: Any = None, text: bool = False
    ) -> tuple[float, bool]:
        ids = self._ids[probe.id]
        if text:
            ids = [self.engine.bos_id, *self.engine.tokenize(_prompt(probe.question, probe.fact))]
        logprobs, greedy = self.engine.score(
            ids, self._answer[probe.id], influences, attendable or self.no_memory
        )
        self.passes += 1
        return float(sum(logprobs)), greedy

    def partner(self, index: int) -> Probe:
        """The fact whose influence a neutral question gets (fixed, spread over kinds)."""
        return self.facts[(index * 7) % len(self.facts)]


def _vectors(
    engine: Any, facts: list[Probe], layers: list[int], baseline: bool
) -> dict[int, np.ndarray]:
    """(facts, hidden) per layer: mean hidden state minus the neutral mean, at layer norm."""
    from hippo_injection.domain.baseline import NEUTRAL_STATEMENTS

    means = engine.hidden_means([f.fact for f in facts], layers)
    neutral = engine.hidden_means(list(NEUTRAL_STATEMENTS), layers) if baseline else None
    out = {}
    for layer in layers:
        rows = means[layer] - (neutral[layer].mean(axis=0) if neutral is not None else 0.0)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        out[layer] = (rows / norms * engine.info.layer_mean_norms[layer]).astype(np.float32)
    return out


def _cell(sweep: Sweep, zero: dict[str, float], fact_arm: Any, neutral_arm: Any) -> Cell:
    gains, matches = [], []
    for i, probe in enumerate(sweep.facts):
        logp, greedy = fact_arm(i, probe)
        gains.append(logp - zero[probe.id])
        matches.append(greedy)
    damages, neutral_matches = [], []
    for i, probe in enumerate(sweep.neutral):
        logp, greedy = neutral_arm(i, probe)
        damages.append(zero[probe.id] - logp)
        neutral_matches.append(greedy)
    return Cell(
        statistics.fmean(gains),
        statistics.fmean(matches),
        statistics.fmean(damages),
        statistics.fmean(neutral_matches),
    )


def prefill(engine: Any, ids: list[int], attendable: Any) -> float:
    """Seconds to the first token of a greedy reply to `ids` (the prefill), with the
    memories `attendable` attached."""
    from hippo_injection.domain.types import Sampling

    began = time.perf_counter()
    run = engine.open(ids, [], attendable, Sampling())
    try:
        run.next_token()
    finally:
        run.close()
    return time.perf_counter() - began


def _latency(
    engine: Any, prompts: list[list[int]], tokens: int, influences: Any, attendable: Any
) -> tuple[float, float]:
    """Median time to first token and median seconds per later token, greedy."""
    from hippo_injection.domain.types import Sampling

    firsts, steps = [], []
    for ids in prompts:
        started = time.perf_counter()
        run = engine.open(ids, influences(ids), attendable(ids), Sampling())
        try:
            run.next_token()
            firsts.append(time.perf_counter() - started)
            step = time.perf_counter()
            for _ in range(tokens - 1):
                run.next_token()
            steps.append((time.perf_counter() - step) / (tokens - 1))
        finally:
            run.close()
    return statistics.median(firsts), statistics.median(steps)


def _heatmaps(grid: dict[str, Any], path_gain: Path, path_damage: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for metric, path, cmap, title in (
        ("gain", path_gain, "viridis", "log p(answer) gain vs zero arm (nats), facts"),
        ("damage", path_damage, "magma_r", "log p drop on neutral questions (nats; >0 = damage)"),
    ):
        arms = [a for a in ("residual", "attendable") if grid[a]["cells"]]
        fig, axes = plt.subplots(1, len(arms), figsize=(6.5 * len(arms), 4.8), squeeze=False)
        for ax, arm in zip(axes[0], arms, strict=True):
            rows, cols = grid[arm]["rows"], grid[arm]["cols"]
            values = np.array(
                [[grid[arm]["cells"][f"{r}|{c}"][metric] for c in cols] for r in rows]
            )
            image = ax.imshow(values, cmap=cmap, aspect="auto", origin="lower")
            ax.set_xticks(range(len(cols)), [f"{c:g}" for c in cols])
            ax.set_yticks(range(len(rows)), [str(r) for r in rows])
            ax.set_xlabel(grid[arm]["col_label"])
            ax.set_ylabel(grid[arm]["row_label"])
            ax.set_title(arm)
            low, high = float(values.min()), float(values.max())
            for (y, x), v in np.ndenumerate(values):
                level = (v - low) / (high - low) if high > low else 0.5
                dark = level < 0.5 if metric == "gain" else level > 0.6  # dark cells: white text
                colour = "w" if dark else "k"
                ax.text(x, y, f"{v:+.1f}", ha="center", va="center", fontsize=8, color=colour)
            fig.colorbar(image, ax=ax)
        fig.suptitle(f"Gemma 3 270M: {title}")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--layers", default="3,6,9,12,15,17", help="residual arm: layers to inject at"
    )
    parser.add_argument(
        "--strengths",
        default="0.03,0.06,0.125,0.25,0.5",
        help="residual arm: strengths, in units of the layer's mean hidden-state norm",
    )
    parser.add_argument(
        "--from-layers",
        default="0,6,12",
        help="attendable arm: first layer that sees the memory values",
    )
    parser.add_argument(
        "--value-scales", default="0.5,1,2", help="attendable arm: multipliers of the memory values"
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="raw mean hidden state (no neutral baseline subtracted)",
    )
    parser.add_argument("--limit", type=int, default=0, help="use only the first N facts (0: all)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="float32: the reference; faster than bfloat16 for whole-prompt passes on AVX2",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads; 1 is fastest on a shared 2-core machine (docs/injection.md)",
    )
    parser.add_argument("--latency-tokens", type=int, default=16)
    parser.add_argument(
        "--replot",
        action="store_true",
        help="redraw the heat maps from bench/out/injection_sweep.json",
    )
    parser.add_argument("--model-dir", default=str(ROOT / "var" / "injection" / "model"))
    args = parser.parse_args()
    if args.replot:
        saved = json.loads((OUT / "injection_sweep.json").read_text())["grid"]
        _heatmaps(saved, OUT / "injection_gain.png", OUT / "injection_damage.png")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from hippo_injection.adapters import loader
    from hippo_injection.adapters.engine import TransformersEngine
    from hippo_injection.domain.types import Attendable, Influence

    torch.manual_seed(0)
    started = time.perf_counter()
    engine = TransformersEngine.load(
        loader.ensure_cached(Path(args.model_dir)), args.dtype, "cpu", args.threads
    )
    facts = _load("injection_facts.jsonl")
    neutral = _load("injection_neutral.jsonl")
    if args.limit:
        facts = facts[: args.limit]
    layers = [int(x) for x in args.layers.split(",")]
    strengths = [float(x) for x in args.strengths.split(",")]
    from_layers = [int(x) for x in args.from_layers.split(",")]
    scales = [float(x) for x in args.value_scales.split(",")]
    sweep = Sweep(engine, facts, neutral)
    vectors = _vectors(engine, facts, layers, baseline=not args.no_baseline)
    print(
        f"# Gemma 3 270M ({args.dtype}, {torch.get_num_threads()} threads): "
        f"{len(facts)} facts, {len(neutral)} neutral questions",
        flush=True,
    )

    zero = {p.id: sweep.score(p, [])[0] for p in facts + neutral}
    zero_cell = _cell(sweep, zero, lambda i, p: sweep.score(p, []), lambda i, p: sweep.score(p, []))
    text_cell = _cell(
        sweep,
        zero,
        lambda i, p: sweep.score(p, [], text=True),
        lambda i, p: sweep.score(
            Probe(p.id, p.question, p.answer, sweep.partner(i).fact), [], text=True
        ),
    )
    index = {p.id: i for i, p in enumerate(facts)}
    grid: dict[str, Any] = {
        "residual": {
            "rows": layers,
            "cols": strengths,
            "row_label": "layer",
            "col_label": "strength (x layer mean norm)",
            "cells": {},
        },
        "attendable": {
            "rows": from_layers,
            "cols": scales,
            "row_label": "from layer",
            "col_label": "value scale",
            "cells": {},
        },
    }
    print(f"\n{'arm':<11} {'setting':<18} {'gain':>7} {'match':>6} {'damage':>7} {'n.match':>7}")
    print(f"{'zero':<11} {'-':<18} {zero_cell.row()}")
    print(f"{'text':<11} {'fact first':<18} {text_cell.row()}", flush=True)
    for layer in layers:
        for strength in strengths:

            def push(
                i: int, p: Probe, fact: Probe | None = None, layer: int = layer, s: float = strength
            ) -> tuple[float, bool]:
                vector = vectors[layer][index[(fact or p).id]]
                return sweep.score(p, [Influence(vector, layer, s)])

            cell = _cell(sweep, zero, push, lambda i, p: push(i, p, sweep.partner(i)))
            grid["residual"]["cells"][f"{layer}|{strength}"] = cell.__dict__
            print(f"{'residual':<11} {f'L{layer} s={strength:g}':<18} {cell.row()}", flush=True)
    for first in from_layers:
        for scale in scales:

            def attend(
                i: int, p: Probe, fact: Probe | None = None, first: int = first, x: float = scale
            ) -> tuple[float, bool]:
                memory = Attendable(((fact or p).fact,), from_layer=first, value_scale=x)
                return sweep.score(p, [], memory)

            cell = _cell(sweep, zero, attend, lambda i, p: attend(i, p, sweep.partner(i)))
            grid["attendable"]["cells"][f"{first}|{scale}"] = cell.__dict__
            print(f"{'attendable':<11} {f'from L{first} x{scale:g}':<18} {cell.row()}", flush=True)

    def best(arm: str) -> tuple[str, dict[str, float]]:
        # Best gain among settings that keep neutral answers intact (damage <= 0.5 nats).
        cells = grid[arm]["cells"]
        safe = {k: v for k, v in cells.items() if v["damage"] <= 0.5} or cells
        key = max(safe, key=lambda k: safe[k]["gain"])
        return key, safe[key]

    best_residual, best_attend = best("residual"), best("attendable")
    layer_b, strength_b = best_residual[0].split("|")
    first_b, scale_b = best_attend[0].split("|")
    lat_prompts = [[engine.bos_id, *engine.tokenize(_prompt(p.question))] for p in facts[:6]]
    text_prompts = [
        [engine.bos_id, *engine.tokenize(_prompt(p.question, p.fact))] for p in facts[:6]
    ]
    fact_of = {tuple(ids): p for ids, p in zip(lat_prompts, facts[:6], strict=True)}
    none: Any = lambda ids: []  # noqa: E731
    no_memory: Any = lambda ids: Attendable()  # noqa: E731
    latency = {
        "zero": _latency(engine, lat_prompts, args.latency_tokens, none, no_memory),
        "residual": _latency(
            engine,
            lat_prompts,
            args.latency_tokens,
            lambda ids: [
                Influence(
                    vectors[int(layer_b)][index[fact_of[tuple(ids)].id]],
                    int(layer_b),
                    float(strength_b),
                )
            ],
            no_memory,
        ),
        "attendable": _latency(
            engine,
            lat_prompts,
            args.latency_tokens,
            none,
            lambda ids: Attendable((fact_of[tuple(ids)].fact,), int(first_b), float(scale_b)),
        ),
        "text": _latency(engine, text_prompts, args.latency_tokens, none, no_memory),
    }
    print(f"\nlatency ({args.latency_tokens} greedy tokens, median of {len(lat_prompts)} prompts)")
    print(f"{'arm':<11} {'TTFT ms':>8} {'ms/token':>9}")
    for arm, (ttft, step) in latency.items():
        print(f"{arm:<11} {ttft * 1000:8.1f} {step * 1000:9.1f}")
    print(
        f"\nbest residual (damage <= 0.5): layer {layer_b}, strength {strength_b}: "
        f"{best_residual[1]}"
    )
    print(
        f"best attendable (damage <= 0.5): from layer {first_b}, scale {scale_b}: {best_attend[1]}"
    )
    print("by kind at the best residual setting (gain, match):")
    kinds: dict[str, list[tuple[float, bool]]] = {}
    for p in facts:
        vector = vectors[int(layer_b)][index[p.id]]
        logp, greedy = sweep.score(p, [Influence(vector, int(layer_b), float(strength_b))])
        kinds.setdefault(p.kind, []).append((logp - zero[p.id], greedy))
    by_kind = {
        k: (statistics.fmean(g for g, _ in v), statistics.fmean(m for _, m in v))
        for k, v in kinds.items()
    }
    for kind, (gain, match) in by_kind.items():
        print(f"  {kind:<11} {gain:+6.2f} {match:5.0%}")
    OUT.mkdir(parents=True, exist_ok=True)
    _heatmaps(grid, OUT / "injection_gain.png", OUT / "injection_damage.png")
    summary = {
        "args": vars(args),
        "zero": zero_cell.__dict__,
        "text": text_cell.__dict__,
        "grid": grid,
        "latency": latency,
        "best_residual": best_residual,
        "best_attendable": best_attend,
        "by_kind": by_kind,
        "passes": sweep.passes,
        "seconds": time.perf_counter() - started,
    }
    (OUT / "injection_sweep.json").write_text(json.dumps(summary, indent=1))
    print(
        f"\n{sweep.passes} scored passes in {time.perf_counter() - started:.0f} s; "
        f"heat maps in {OUT}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
