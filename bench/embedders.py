"""What each embedder costs in-process: the built-in ones and any directory given.

For each embedder available here (the built-in all-MiniLM-L6-v2 on onnx, as the default
dynamic int8 graph and as the packaged graph (`ONNX_QUANTIZATION=weights`), and, when
sentence-transformers is installed, as torch fp32; then every `--model NAME=PATH`, a
directory as HIPPO_EMBEDDING_MODELS takes it) it loads the encoder in this process the
way the service does (`adapters.load_spec`) and measures, on distinct LoCoMo dev turns:

* batch 1: N single-text calls (texts/s, p50 and p95 ms per call);
* batch 64: M calls of 64 texts (texts/s).

The corpus, the warm-up and the two loads are bench/embedding.py's own (`load_texts`,
`make_plan`, `fill_b1_big`); each figure is the median over --rounds. No gRPC: for the
cost of the edge, run bench/embedding.py.

Run:
    .venv/bin/python bench/embedders.py
    .venv/bin/python bench/embedders.py --model small=/models/st128 --model e5=/models/e5-onnx
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from embedding import (
    DEFAULT_DATA,
    PathResult,
    fill_b1_big,
    fmt,
    load_texts,
    make_plan,
    median_result,
)

from hippo_embedding import adapters, specs
from hippo_embedding.settings import EmbeddingSettings


@dataclass(frozen=True)
class Embedder:
    label: str  # what the table calls it
    spec: specs.ModelSpec
    backend: str  # EmbeddingSettings.backend: picks the built-in runtime
    quantization: str = "dynamic"  # EmbeddingSettings.onnx_quantization (built-in onnx)


def embedders(extra: Sequence[str]) -> list[Embedder]:
    builtin = specs.ModelSpec(specs.BUILTIN_NAME, "builtin")
    found = [
        Embedder("builtin onnx dynamic int8 (default)", builtin, "onnx"),
        Embedder("builtin onnx, packaged graph", builtin, "onnx", "weights"),
    ]
    if importlib.util.find_spec("sentence_transformers") is not None:
        found.append(Embedder("builtin torch fp32", builtin, "torch"))
    for item in extra:
        (spec,) = specs.parse(item, "onnx")  # ValueError names what is wrong
        found.append(Embedder(spec.name, spec, "onnx"))
    return found


@dataclass
class Row:
    embedder: Embedder
    backend: str = "-"
    dimension: int = 0
    load_s: float = 0.0
    result: PathResult | None = None  # fill_b1_big's figures; `path` holds the label
    error: str = ""


def measure(embedder: Embedder, threads: int, texts: list[str], args: argparse.Namespace) -> Row:
    """Load once (the load time includes importing the runtime), then --rounds runs."""
    row = Row(embedder)
    settings = EmbeddingSettings(
        backend=embedder.backend, threads=threads, onnx_quantization=embedder.quantization
    )
    plan = make_plan(texts, args.n, args.m, args.batch_size, 0)
    started = time.perf_counter()
    encoder = adapters.load_spec(embedder.spec, settings)
    row.load_s = time.perf_counter() - started
    row.backend, row.dimension = encoder.backend, encoder.dimension

    def call(batch: list[str]) -> np.ndarray:
        vectors = np.asarray(encoder.encode(batch))
        if vectors.shape != (len(batch), row.dimension):
            raise RuntimeError(f"vectors of shape {vectors.shape}")
        return vectors

    rounds: list[PathResult] = []
    for _ in range(args.rounds):
        result = PathResult(row.backend, threads, embedder.label)
        fill_b1_big(result, call, plan)
        rounds.append(result)
    row.result = median_result(rounds)
    return row  # the encoder goes with this frame


def table(rows: list[Row], batch: int) -> str:
    header = ["embedder", "backend", "dim", "load s", "b1 texts/s", "b1 p50 ms", "b1 p95 ms"]
    header.append(f"b{batch} texts/s")
    cells = []
    for row in rows:
        r = row.result
        if r is None:
            cells.append([row.embedder.label, row.backend, "-", "-", "failed", "-", "-", "-"])
            continue
        cells.append(
            [
                row.embedder.label,
                row.backend,
                str(row.dimension),
                fmt(row.load_s, 1),
                fmt(r.b1_tps),
                fmt(r.b1_p50_ms, 2),
                fmt(r.b1_p95_ms, 2),
                fmt(r.big_tps),
            ]
        )
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out.extend("| " + " | ".join(c) + " |" for c in cells)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a directory to measure too, as HIPPO_EMBEDDING_MODELS takes it (repeatable)",
    )
    parser.add_argument("--threads", type=int, default=1, help="model threads (THREADS)")
    parser.add_argument("-n", "--n", type=int, default=200, help="batch-1 calls")
    parser.add_argument("-m", "--m", type=int, default=8, help="batch-64 calls")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="each figure: median of rounds")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

    try:
        chosen = embedders(args.model)
    except ValueError as exc:
        parser.error(str(exc))
    need = args.n + args.m * args.batch_size + args.batch_size
    texts, source = load_texts(args.data, need)
    print(
        f"corpus: {source} ({len(texts)} distinct texts, mean "
        f"{np.mean([len(t) for t in texts]):.0f} chars); b1 = {args.n} calls, "
        f"b{args.batch_size} = {args.m} calls, threads={args.threads}, rounds={args.rounds}; "
        f"{platform.platform()}, {os.cpu_count()} CPUs",
        flush=True,
    )
    rows: list[Row] = []
    for embedder in chosen:
        print(f"  {embedder.label} ...", flush=True)
        try:
            rows.append(measure(embedder, args.threads, texts, args))
        except Exception as exc:  # report it and go on with the next embedder
            rows.append(Row(embedder, error=repr(exc)[:500]))
        gc.collect()
    print()
    print(table(rows, args.batch_size))
    for row in rows:
        if row.error:
            print(f"ERROR {row.embedder.label}: {row.error}")
    return 1 if any(row.error for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
