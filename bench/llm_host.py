"""The LLM host's speed: in-process vs gRPC vs the TGI HTTP API, bf16 vs fp32, with and
without one influence; plus bf16's agreement with fp32.

For each dtype: time to first token (TTFT, the 256-token prompt's prefill plus one
sample) and decode tokens/s for 64 greedy tokens, median over rounds, for
  in-process   the domain service called directly (no transport);
  grpc         a real service process, streaming Generate;
  http         the same process through `text_generation.Client.generate_stream`;
each without and with one influence (a value vector at layer 13, strength 0.5; the HTTP
API carries no influences). The ratio to in-process is the transport's overhead. RSS of
the service process after the runs. Quality: over reference texts, how often bf16's
next-token argmax equals fp32's, mean KL(fp32 || bf16), and whether 64 greedy tokens
are identical.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/llm_host.py [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "var" / "injection" / "model"
FULL_NAME = "hippo.injection.v1.InjectionService"
PARAGRAPH = (
    "The old harbour town wakes slowly. Fishing boats return before dawn, and the market "
    "fills with the smell of salt and bread. Children walk to school along the sea wall "
    "while gulls argue over the nets. In the afternoon the wind turns, the cafes open "
    "their shutters, and visitors climb the hill to the lighthouse to watch the ferries. "
)
INFLUENCE_LAYER, INFLUENCE_STRENGTH = 13, 0.5


def prompt_of(engine: Any, tokens: int) -> str:
    """Text whose encoding is `tokens` ids with <bos> (prose, cut at a token boundary)."""
    ids = engine.tokenize(PARAGRAPH * 20)[: tokens - 1]
    text = str(engine.decode(ids))
    assert len(engine.tokenize(text)) == tokens - 1, "cut changed the tokenisation"
    return text


def _timed(stream: Iterator[Any] | Callable[[], Iterator[Any]]) -> tuple[float, float, int]:
    """TTFT, decode tokens/s after the first token, tokens."""
    started = time.perf_counter()
    first = last = 0.0
    count = 0
    for _ in stream() if callable(stream) else stream:
        count += 1
        last = time.perf_counter()
        if count == 1:
            first = last
    return first - started, (count - 1) / (last - first) if count > 1 else 0.0, count


async def _timed_async(items: Any) -> tuple[float, float, int]:
    started = time.perf_counter()
    first = last = 0.0
    count = 0
    async for _ in items:
        count += 1
        last = time.perf_counter()
        if count == 1:
            first = last
    return first - started, (count - 1) / (last - first) if count > 1 else 0.0, count


def _median(runs: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        min(r[2] for r in runs),
    )


def _vector(engine: Any) -> np.ndarray:
    from hippo_injection.domain.baseline import NEUTRAL_STATEMENTS

    means = engine.hidden_means(["My favourite colour is teal.", *NEUTRAL_STATEMENTS], [13])[13]
    vector = means[0] - means[1:].mean(axis=0)
    scale = engine.info.layer_mean_norms[INFLUENCE_LAYER] / np.linalg.norm(vector)
    out: np.ndarray = (vector * scale).astype(np.float32)
    return out


def in_process(engine: Any, text: str, vector: np.ndarray, rounds: int, new: int) -> dict[str, Any]:
    from hippo_injection.domain.queue import ModelQueue
    from hippo_injection.domain.service import InjectionService
    from hippo_injection.domain.types import GenerateRequest, Influence, Prompt
    from hippo_injection.domain.validation import Limits

    limits = Limits(4096, 1024, 4, 256, 8, 64.0, 16, 1024, 16.0, 256)
    influence = Influence(vector, INFLUENCE_LAYER, INFLUENCE_STRENGTH)
    out = {}
    for label, influences in (("none", ()), ("one", (influence,))):
        request = GenerateRequest(Prompt(text=text), max_new_tokens=new, influences=influences)

        async def once(request: GenerateRequest = request) -> tuple[float, float, int]:
            service = InjectionService(engine, ModelQueue(1), limits)
            return await _timed_async(service.generate(request))

        out[label] = _median([asyncio.run(once()) for _ in range(rounds)])
    return out


def through_service(
    dtype: str, text: str, vector: np.ndarray, rounds: int, new: int, threads: int
) -> dict[str, Any]:
    import grpc
    import psutil
    from text_generation import Client

    from hippo.injection.v1 import injection_pb2 as pb
    from hippo.injection.v1 import injection_pb2_grpc
    from hippo_core.listen import reserve_port
    from hippo_core.testing import service_process, wait_for

    http_port = reserve_port()
    env = {
        "HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR),
        "HIPPO_INJECTION_HTTP_PORT": str(http_port),
        "HIPPO_INJECTION_DTYPE": dtype,
        "HIPPO_INJECTION_THREADS": str(threads),
    }
    out: dict[str, Any] = {}
    with service_process("hippo_injection", "HIPPO_INJECTION_", env) as proc:
        started = time.perf_counter()
        wait_for(proc.addr, FULL_NAME, timeout=300)
        out["ready_s"] = time.perf_counter() - started
        influence = pb.Influence(
            vector=vector.astype("<f4").tobytes(),
            layer=INFLUENCE_LAYER,
            strength=INFLUENCE_STRENGTH,
        )
        with grpc.insecure_channel(proc.addr) as channel:
            stub = injection_pb2_grpc.InjectionServiceStub(channel)
            for label, influences in (("none", []), ("one", [influence])):
                request = pb.GenerateRequest(prompt=text, max_new_tokens=new, influences=influences)
                call = functools.partial(stub.Generate, request, timeout=600)
                runs = [_timed(call) for _ in range(rounds)]
                out[f"grpc_{label}"] = _median(runs)
        client = Client(f"http://127.0.0.1:{http_port}", timeout=600)
        out["http_none"] = _median(
            [
                _timed(lambda: client.generate_stream(text, max_new_tokens=new))
                for _ in range(rounds)
            ]
        )
        out["rss_mib"] = psutil.Process(proc.process.pid).memory_info().rss / 2**20
    return out


def agreement(fp32: Any, bf16: Any, texts: list[str], new: int) -> dict[str, float]:
    import torch

    from hippo_injection.domain.types import Attendable, Sampling

    agree, total, kls = 0, 0, []
    for text in texts:
        ids = [fp32.bos_id, *fp32.tokenize(text)]
        logits = []
        for engine in (fp32, bf16):
            run = engine.open(ids, [], Attendable(), Sampling())
            logits.append(torch.log_softmax(run.forward(ids, len(ids)), dim=-1))
            run.close()
        a, b = logits
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
        kls.append(float((a.exp() * (a - b)).sum(-1).mean()))
    greedy_same = 0
    for text in texts:
        ids = [fp32.bos_id, *fp32.tokenize(text)]
        outs = []
        for engine in (fp32, bf16):
            run = engine.open(ids, [], Attendable(), Sampling())
            outs.append([run.next_token()[0] for _ in range(new)])
            run.close()
        greedy_same += int(outs[0] == outs[1])
    return {
        "top1_agreement": agree / total,
        "mean_kl": statistics.fmean(kls),
        "greedy_identical": greedy_same / len(texts),
        "positions": total,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (the service default)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtypes", default="bfloat16,float32")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import psutil
    import torch

    from hippo_injection.adapters import loader
    from hippo_injection.adapters.engine import TransformersEngine
    from hippo_injection.domain.baseline import NEUTRAL_STATEMENTS

    path = loader.ensure_cached(MODEL_DIR)
    print(
        f"# {args.prompt_tokens}-token prompt, {args.new_tokens} greedy tokens, "
        f"{args.threads} thread(s), median of {args.rounds}; load {os.getloadavg()[0]:.1f}"
    )
    engines = {}
    rows = []
    for dtype in args.dtypes.split(","):
        started = time.perf_counter()
        engine = TransformersEngine.load(path, dtype, "cpu", args.threads)
        load_s = time.perf_counter() - started
        engines[dtype] = engine
        text = prompt_of(engine, args.prompt_tokens)
        vector = _vector(engine)
        local = in_process(engine, text, vector, args.rounds, args.new_tokens)
        remote = through_service(dtype, text, vector, args.rounds, args.new_tokens, args.threads)
        base_ttft, base_tps, _ = local["none"]
        for path_name, influence, result in (
            ("in-process", "none", local["none"]),
            ("in-process", "one", local["one"]),
            ("grpc", "none", remote["grpc_none"]),
            ("grpc", "one", remote["grpc_one"]),
            ("http (TGI)", "none", remote["http_none"]),
        ):
            ttft, tps, count = result
            rows.append(
                (
                    dtype,
                    path_name,
                    influence,
                    ttft,
                    tps,
                    count,
                    ttft / base_ttft,
                    base_tps / tps if tps else float("nan"),
                )
            )
        print(
            f"{dtype}: engine load {load_s:.2f} s, service ready {remote['ready_s']:.1f} s, "
            f"service RSS {remote['rss_mib']:.0f} MiB",
            flush=True,
        )
    print(
        f"\n{'dtype':<9} {'path':<11} {'infl':<5} {'TTFT s':>7} {'tok/s':>6} {'n':>3} "
        f"{'TTFT x':>7} {'1/tps x':>8}"
    )
    for dtype, path_name, influence, ttft, tps, count, rt, rs in rows:
        print(
            f"{dtype:<9} {path_name:<11} {influence:<5} {ttft:7.2f} {tps:6.1f} {count:3d} "
            f"{rt:7.2f} {rs:8.2f}"
        )
    print(
        "\nbench process RSS (both engines loaded): "
        f"{psutil.Process().memory_info().rss / 2**20:.0f} MiB"
    )
    if {"float32", "bfloat16"} <= engines.keys():
        texts = [*NEUTRAL_STATEMENTS[:8], prompt_of(engines["float32"], 64)]
        quality = agreement(engines["float32"], engines["bfloat16"], texts, 32)
        print(
            f"bf16 vs fp32 over {quality['positions']} positions: top-1 agreement "
            f"{quality['top1_agreement']:.1%}, mean KL {quality['mean_kl']:.4f} nats, "
            f"32 greedy tokens identical for {quality['greedy_identical']:.0%} "
            f"of {len(texts)} prompts"
        )
    print(f"torch {torch.__version__}, load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
