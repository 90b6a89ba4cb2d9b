"""Does the memtok pipeline find the right memory, and does applying it help? (issue 8)

In process, real models: Gemma 3 270M (LLM1, LLM2, value vectors) and all-MiniLM-L6-v2
(key vectors), a fresh memtok store in a temporary folder, one user.

1. The facts of bench/data/injection_facts.jsonl are written as operator turns (one
   an hour). A fact's memtoks are the items its write created or merged into.
2. Shortlist recall@k: for each fact's probe question, is one of the fact's memtoks in
   the top k? Clean probes are the questions as written; hard ones are the same
   questions made informal (lower case, no punctuation, a chatty opener) with two
   letter-swap typos (rule-made, deterministic; no human paraphrases). Reported for the
   similarity order of the shortlist and for the merged order.
3. Ablation: each of the three scores dropped in turn (its weight set to 0).
4. Weights tuned on the even-numbered probes (grid), measured on the odd-numbered ones.
5. Zero vs on: log p and greedy exact match of each probe's answer with the influences
   the pipeline chose (mode ON) vs none; damage on the neutral questions (the pipeline
   runs on them too); the pipeline's latency per query. The routes side by side (issue
   20): zero, residual (value vectors), attend (the same pipeline's winners, their
   stored states attended: --attend-layer), and text (their source words quoted before
   the question); then the time to first token with up to 1, 5 and 10 winners applied
   each way, the prompt tokens each reads, and the stored states' bytes per memory.
6. Growth and store behaviour: LoCoMo operator turns are written as distractors into the
   same user's store; recall@10 after each quarter; admissions, merges, rejections per
   1,000 operator turns.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/influence_eval.py [--facts 60] [--locomo 40]

Writes bench/out/influence_eval.json and bench/out/influence_growth.png.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from injection_sweep import prefill

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
OUT = ROOT / "bench" / "out"
LOCOMO = ROOT.parent / "shared" / "data" / "locomo-dev.json"
HOUR_US = 3_600_000_000
T0 = 1_700_000_000_000_000
KS = (1, 5, 10)


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def hard(question: str, seed: int) -> str:
    """Informal, with two letter-swap typos (deterministic per probe)."""
    rng = random.Random(seed)
    words = question.lower().rstrip("?.!").replace(",", "").split()
    for _ in range(2):
        candidates = [i for i, w in enumerate(words) if len(w) > 3]
        if not candidates:
            break
        i = rng.choice(candidates)
        w = words[i]
        j = rng.randrange(len(w) - 1)
        words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
    return rng.choice(["hey so ", "quick q: ", "umm ", ""]) + " ".join(words)


class Embedder:
    def __init__(self) -> None:
        from hippo_embedding.adapters.torch_encoder import TorchEncoder

        self._encoder = TorchEncoder(threads=1)

    def embed(self, texts: Sequence[str]) -> Any:
        return self._encoder.encode(list(texts))


def recall(orders: list[list[str]], right: list[set[str]], k: int) -> float:
    pairs = [(o, r) for o, r in zip(orders, right, strict=True) if r]
    return sum(1 for o, r in pairs if r & set(o[:k])) / max(len(pairs), 1)


def merged_order(
    ranked: list[tuple[str, float, float, float, float]], w: tuple[float, ...]
) -> list[str]:
    scored = [(i, w[0] * sal + w[1] * sim + w[2] * l2) for i, sal, sim, l2, _ in ranked]
    return [i for i, _ in sorted(scored, key=lambda x: -x[1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=60)
    parser.add_argument("--locomo", type=int, default=40, help="LoCoMo operator turns (growth)")
    parser.add_argument("--growth-probes", type=int, default=20)
    parser.add_argument("--neutral", type=int, default=20)
    parser.add_argument(
        "--attend-layer", type=int, default=6, help="attend arm: values from this layer up"
    )
    parser.add_argument(
        "--latency-probes", type=int, default=10, help="probes per time-to-first-token cell"
    )
    args = parser.parse_args()

    import torch

    from hippo_cli import locomo
    from hippo_cli.seed import exchanges
    from hippo_injection.__main__ import open_store
    from hippo_injection.adapters import loader
    from hippo_injection.adapters.engine import TransformersEngine
    from hippo_injection.domain.memtok.pipeline import (
        InfluencePipeline,
        Mode,
        PipelineSettings,
        Route,
    )
    from hippo_injection.domain.memtok.policy import Policy
    from hippo_injection.settings import InjectionSettings

    torch.set_num_threads(1)
    started = time.perf_counter()
    engine = TransformersEngine.load(
        loader.ensure_cached(ROOT / "var" / "injection" / "model"), "float32", "cpu", 1
    )
    embedder = Embedder()
    facts = load_jsonl(DATA / "injection_facts.jsonl")[: args.facts]
    neutral = load_jsonl(DATA / "injection_neutral.jsonl")[: args.neutral]
    workdir = Path(tempfile.mkdtemp(prefix="influence-eval-"))
    # The store keeps each item's attendable states too (the attend arm of step 5).
    settings = InjectionSettings(data_dir=str(workdir), memtok_attend_layer=args.attend_layer)
    store = open_store(settings, engine, embedder)
    defaults = PipelineSettings()
    # LLM2 scores the whole shortlist here, so every ordering can be measured offline.
    every = PipelineSettings(llm2_keep=defaults.shortlist)
    pipeline = InfluencePipeline(engine, store, every)
    policy: Policy = store.policy
    print(f"models loaded in {time.perf_counter() - started:.1f} s; store in {workdir}")

    # 1. write the facts
    right: list[set[str]] = []
    outcomes: dict[str, int] = {}
    writes = 0
    t = T0
    for fact in facts:
        report = pipeline.write("t", "u", fact["fact"], "", t)
        writes += 1
        t += HOUR_US
        right.append({w.memtok_id for w in report.written if w.outcome in ("new", "merged")})
        for k, v in report.counts().items():
            outcomes[k] = outcomes.get(k, 0) + v
    print(f"facts written: {outcomes}; facts with a memtok: {sum(1 for r in right if r)}")

    # 2. recall@k, clean and hard
    def probe_all(questions: list[str], when: int) -> tuple[list[Any], list[float]]:
        plans, seconds = [], []
        for q in questions:
            began = time.perf_counter()
            plans.append(pipeline.plan("t", "u", q, when, Mode.DISCLOSE_ONLY))
            seconds.append(time.perf_counter() - began)
        return plans, seconds

    clean_q = [f["question"] for f in facts]
    hard_q = [hard(f["question"], i) for i, f in enumerate(facts)]
    results: dict[str, Any] = {"facts": len(facts), "store_outcomes_facts": outcomes}
    w0 = (defaults.weights.salience, defaults.weights.similarity, defaults.weights.llm2)
    cached: dict[str, list[Any]] = {}
    for name, questions in (("clean", clean_q), ("hard", hard_q)):
        plans, seconds = probe_all(questions, t)
        ranked = [p.ranked for p in plans]
        cached[name] = ranked
        by_sim = [[i for i, *_ in sorted(r, key=lambda x: -x[2])] for r in ranked]
        merged = [merged_order(r, w0) for r in ranked]
        results[name] = {
            "similarity": {f"@{k}": recall(by_sim, right, k) for k in KS},
            "merged": {f"@{k}": recall(merged, right, k) for k in KS},
            "shortlist_mean": statistics.mean(p.shortlist for p in plans),
            "plan_ms_p50": 1000 * statistics.median(seconds),
        }
        print(name, json.dumps(results[name]))

    # 3. ablation
    ablation = {}
    for drop, label in enumerate(("salience", "similarity", "llm2")):
        w = tuple(0.0 if i == drop else x for i, x in enumerate(w0))
        ablation[f"without {label}"] = {
            name: recall([merged_order(r, w) for r in cached[name]], right, 10)
            for name in ("clean", "hard")
        }
    ablation["all three"] = {
        name: recall([merged_order(r, w0) for r in cached[name]], right, 10)
        for name in ("clean", "hard")
    }
    results["ablation_recall@10"] = ablation
    print("ablation", json.dumps(ablation))

    # 4. weights tuned on the even probes, measured on the odd ones (clean + hard pooled)
    grid = [g for g in itertools.product((0.0, 0.25, 0.5, 0.75, 1.0), repeat=3) if any(g)]

    def split_recall(w: tuple[float, ...], parity: int, k: int = 5) -> float:
        orders, truth = [], []
        for name in ("clean", "hard"):
            for i, r in enumerate(cached[name]):
                if i % 2 == parity:
                    orders.append(merged_order(r, w))
                    truth.append(right[i])
        return recall(orders, truth, k)

    best = max(grid, key=lambda w: (split_recall(w, 0), split_recall(w, 0, 1)))
    results["tuning"] = {
        "best_weights_on_train": best,
        "train_recall@5": split_recall(best, 0),
        "test_recall@5": split_recall(best, 1),
        "default_weights": w0,
        "default_test_recall@5": split_recall(w0, 1),
    }
    print("tuning", json.dumps(results["tuning"]))

    # 5. zero vs on, and the routes side by side: the residual influences (today), the
    # same pipeline's winners attended from their stored states (issue 20), and their
    # source words quoted as text before the question.
    def answer_score(
        question: str, answer: str, influences: Sequence[Any], attend: Any = None, quoted: str = ""
    ) -> tuple[float, bool]:
        head = f"{quoted}\n" if quoted else ""
        ids = [engine.bos_id, *engine.tokenize(f"{head}Question: {question}\nAnswer:")]
        cont = engine.tokenize(" " + answer)
        logprobs, greedy = engine.score(ids, cont, influences, attend or _no_attend())
        return float(sum(logprobs)), greedy

    on_pipeline = InfluencePipeline(engine, store, defaults)
    attend_pipeline = InfluencePipeline(engine, store, replace(defaults, route=Route.ATTEND))

    latency: list[float] = []  # the default pipeline's plan, per fact question

    def arms(question: str, answer: str) -> dict[str, tuple[float, bool, int]]:
        """log p, greedy match and memories used, per arm, for one question."""
        began = time.perf_counter()
        residual = on_pipeline.plan("t", "u", question, t, Mode.ON)
        latency.append(time.perf_counter() - began)
        attended = attend_pipeline.plan("t", "u", question, t, Mode.ON)
        chosen = store.items.get("t", "u", [a.memtok_id for a in attended.applied])
        quoted = "\n".join(m.source_words for m in chosen)
        n = len(attended.applied)
        out = {"zero": (*answer_score(question, answer, []), 0)}
        out["residual"] = (
            *answer_score(question, answer, residual.influences),
            len(residual.influences),
        )
        out["attend"] = (*answer_score(question, answer, [], attended.attendable), n)
        out["text"] = (*answer_score(question, answer, [], quoted=quoted), n)
        return out

    per_fact = [arms(f["question"], f["answer"]) for f in facts]
    plans_s = list(latency)  # the fact questions' plans (as before: not the neutral ones)
    per_neutral = [arms(q["question"], q["answer"]) for q in neutral]
    results["routes"] = {
        arm: {
            "gain_nats_mean": statistics.mean(r[arm][0] - r["zero"][0] for r in per_fact),
            "exact_match": statistics.mean(float(r[arm][1]) for r in per_fact),
            "memories_per_probe": statistics.mean(r[arm][2] for r in per_fact),
            "neutral_damage_nats_mean": statistics.mean(
                r["zero"][0] - r[arm][0] for r in per_neutral
            )
            if per_neutral
            else 0.0,
            "neutral_match": statistics.mean(float(r[arm][1]) for r in per_neutral)
            if per_neutral
            else 0.0,
        }
        for arm in ("zero", "residual", "attend", "text")
    }
    print("routes", json.dumps(results["routes"]))

    # 5b. Time to first token with 1, 5 and 10 memories: the pipeline's own winners (it may
    # apply up to N here), as stored states attended vs their source words quoted in the
    # prompt; the prompt tokens each reads; the stored states' bytes per memory.
    ttft: dict[str, Any] = {}
    sizes: list[int] = []
    for count in (1, 5, 10):
        wide = InfluencePipeline(
            engine,
            store,
            replace(defaults, route=Route.ATTEND, max_inject=count, attend_tokens=64 * count),
        )
        cells: dict[str, list[float]] = {"text": [], "attend": []}
        tokens: dict[str, list[int]] = {"text": [], "attend": []}
        used: list[int] = []
        for f in facts[: args.latency_probes]:
            plan = wide.plan("t", "u", f["question"], t, Mode.ON)
            if plan.attendable is None:
                continue
            chosen = store.items.get("t", "u", [a.memtok_id for a in plan.applied])
            quoted = "\n".join(m.source_words for m in chosen)
            question = [engine.bos_id, *engine.tokenize(f"Question: {f['question']}\nAnswer:")]
            text_ids = [
                engine.bos_id,
                *engine.tokenize(f"{quoted}\nQuestion: {f['question']}\nAnswer:"),
            ]
            used.append(len(plan.attendable.states))
            sizes.extend(st.nbytes for st in plan.attendable.states)
            for arm, ids, attend in (
                ("text", text_ids, _no_attend()),
                ("attend", question, plan.attendable),
            ):
                prefill(engine, ids, attend)  # warm
                cells[arm].append(prefill(engine, ids, attend))
                tokens[arm].append(len(ids))
        ttft[str(count)] = {
            "memories_mean": statistics.mean(used) if used else 0.0,
            **{
                f"{arm}_ttft_ms_p50": 1000 * statistics.median(v) if v else 0.0
                for arm, v in cells.items()
            },
            **{
                f"{arm}_prompt_tokens_mean": statistics.mean(v) if v else 0.0
                for arm, v in tokens.items()
            },
        }
    results["ttft"] = ttft
    results["states_bytes_per_memory"] = statistics.mean(sizes) if sizes else 0.0
    print("ttft", json.dumps(ttft), "bytes", results["states_bytes_per_memory"])
    # Zero vs on with the residual route, from the same passes as the routes above.
    results["zero_vs_on"] = {
        "gain_nats_mean": statistics.mean(r["residual"][0] - r["zero"][0] for r in per_fact),
        "exact_match_zero": statistics.mean(float(r["zero"][1]) for r in per_fact),
        "exact_match_on": statistics.mean(float(r["residual"][1]) for r in per_fact),
        "influences_per_probe": statistics.mean(r["residual"][2] for r in per_fact),
        "neutral_damage_nats_mean": statistics.mean(
            r["zero"][0] - r["residual"][0] for r in per_neutral
        )
        if per_neutral
        else 0.0,
        "neutral_match_zero": statistics.mean(float(r["zero"][1]) for r in per_neutral)
        if per_neutral
        else 0.0,
        "neutral_match_on": statistics.mean(float(r["residual"][1]) for r in per_neutral)
        if per_neutral
        else 0.0,
        "influences_per_neutral": statistics.mean(r["residual"][2] for r in per_neutral)
        if per_neutral
        else 0.0,
        "pipeline_ms_p50": 1000 * statistics.median(plans_s),
        "pipeline_ms_mean": 1000 * statistics.mean(plans_s),
    }
    print("zero_vs_on", json.dumps(results["zero_vs_on"]))

    # 6. growth and store behaviour
    growth = []
    probes = list(range(min(args.growth_probes, len(facts))))

    def growth_point(turns: int) -> None:
        plans, _ = probe_all([clean_q[i] for i in probes], t)
        orders = [merged_order(p.ranked, w0) for p in plans]
        size = len(store.items.by_user("t", "u"))
        growth.append(
            {
                "locomo_turns": turns,
                "items": size,
                "recall@10": recall(orders, [right[i] for i in probes], 10),
            }
        )
        print("growth", growth[-1])

    growth_point(0)
    stream: list[tuple[str, str, int]] = []
    if LOCOMO.exists():
        for conv in locomo.load(LOCOMO):
            stream += exchanges(conv)
    stream = stream[: args.locomo]
    quarter = max(1, len(stream) // 4)
    for n, (text, reply, _) in enumerate(stream, start=1):
        t += HOUR_US
        report = pipeline.write("t", "u", text, reply, t)
        writes += 1
        for k, v in report.counts().items():
            outcomes[k] = outcomes.get(k, 0) + v
        if n % quarter == 0 or n == len(stream):
            growth_point(n)
    results["growth"] = growth
    results["store_per_1k_operator_turns"] = {
        k: round(1000 * v / writes, 1) for k, v in sorted(outcomes.items())
    }
    results["operator_turns"] = writes
    results["policy"] = {k: v for k, v in policy.__dict__.items() if not k.startswith("_")}
    results["seconds"] = time.perf_counter() - started
    print("store per 1k operator turns", results["store_per_1k_operator_turns"])

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "influence_eval.json").write_text(json.dumps(results, indent=2, default=list))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot([g["items"] for g in growth], [g["recall@10"] for g in growth], marker="o")
        ax.set_xlabel("memtoks in the store")
        ax.set_ylabel("recall@10 (clean probes)")
        ax.set_ylim(0, 1.05)
        fig.tight_layout()
        fig.savefig(OUT / "influence_growth.png", dpi=120)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    print_table(results)
    store.keys.close()
    store.items.close()


def _no_attend() -> Any:
    from hippo_injection.domain.types import Attendable

    return Attendable()


def print_table(r: dict[str, Any]) -> None:
    print("\n| probes | order | recall@1 | recall@5 | recall@10 |\n|---|---|---|---|---|")
    for name in ("clean", "hard"):
        for order in ("similarity", "merged"):
            v = r[name][order]
            print(f"| {name} | {order} | {v['@1']:.2f} | {v['@5']:.2f} | {v['@10']:.2f} |")
    print("\n| scores | clean recall@10 | hard recall@10 |\n|---|---|---|")
    for label, v in r["ablation_recall@10"].items():
        print(f"| {label} | {v['clean']:.2f} | {v['hard']:.2f} |")
    print(
        "\n| route (step 5) | gain nats | exact match | memories/probe | neutral damage nats "
        "| neutral match |\n|---|---|---|---|---|---|"
    )
    for arm, v in r["routes"].items():
        print(
            f"| {arm} | {v['gain_nats_mean']:+.2f} | {v['exact_match']:.0%} | "
            f"{v['memories_per_probe']:.1f} | {v['neutral_damage_nats_mean']:+.2f} | "
            f"{v['neutral_match']:.0%} |"
        )
    print(
        "\n| memories applied (at most) | mean | text ttft ms (prompt tokens) "
        "| attend ttft ms (prompt tokens) |\n|---|---|---|---|"
    )
    for count, v in r["ttft"].items():
        print(
            f"| {count} | {v['memories_mean']:.1f} | {v['text_ttft_ms_p50']:.0f} "
            f"({v['text_prompt_tokens_mean']:.0f}) | {v['attend_ttft_ms_p50']:.0f} "
            f"({v['attend_prompt_tokens_mean']:.0f}) |"
        )
    print(f"stored states per memory: {r['states_bytes_per_memory'] / 1024:.0f} KiB (float16)")
    z = r["zero_vs_on"]
    print(
        f"\nzero vs on: gain {z['gain_nats_mean']:+.2f} nats, exact match "
        f"{z['exact_match_zero']:.0%} -> {z['exact_match_on']:.0%}, "
        f"{z['influences_per_probe']:.1f} influences/probe; neutral damage "
        f"{z['neutral_damage_nats_mean']:+.2f} nats, match {z['neutral_match_zero']:.0%} -> "
        f"{z['neutral_match_on']:.0%}; pipeline {z['pipeline_ms_p50']:.0f} ms p50"
    )


if __name__ == "__main__":
    main()
