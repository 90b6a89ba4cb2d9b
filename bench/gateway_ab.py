"""One client's Recall latency through two gateways that differ in one setting,
interleaved on one set of backends, so machine drift hits both arms alike.

Two gateways (`--setting NAME=A,B`: HIPPO_GATEWAY_<NAME> is A in one, B in the other)
share one embedding and one retrieval service; the dev turns are remembered once, then
each question is asked of both gateways, alternating which goes first. bench/load.py
compares whole clusters one after the other, and there the first arm ran slower in every
service, the ones a setting does not touch included: a gain of a few milliseconds there
can be the order of the arms (docs/operations.md).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/gateway_ab.py --setting NAME=A,B [--rounds 3]
        [--informal SEED]

`--informal SEED` asks the questions as people type them (bench/informal.py). The
embedding service's cache is off, so every Recall embeds its query.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import grpc
from informal import informal
from recall_latency import corpus
from stats import percentile

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.listen import reserve_port
from hippo_core.testing import service_process, wait_for

KEY = "ab-key"
HEADERS = (("x-api-key", KEY),)
USER = "ab-user"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1451, help="turns remembered")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the questions")
    parser.add_argument(
        "--setting", required=True, help="NAME=A,B: HIPPO_GATEWAY_<NAME> of the two gateways"
    )
    parser.add_argument("--informal", type=int, metavar="SEED", help="typo-laden questions")
    args = parser.parse_args()
    name, _, values = args.setting.partition("=")
    arms = values.split(",")
    if not name or len(arms) != 2:
        parser.error("--setting wants NAME=A,B")
    texts, questions = corpus()
    if args.informal is not None:
        questions = [informal(q, args.informal) for q in questions]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hippo-ab-")))
        embedding = stack.enter_context(
            service_process(
                "hippo_embedding", "HIPPO_EMBEDDING_", {"HIPPO_EMBEDDING_CACHE_ENTRIES": "0"}
            )
        )
        retrieval = stack.enter_context(
            service_process(
                "hippo_retrieval",
                "HIPPO_RETRIEVAL_",
                {
                    "HIPPO_RETRIEVAL_DATA_DIR": str(tmp / "retrieval"),
                    "HIPPO_RETRIEVAL_PORT": str(reserve_port()),
                },
            )
        )
        wait_for(embedding.addr, "hippo.embedding.v1.EmbeddingService", timeout=120)
        wait_for(retrieval.addr, "hippo.retrieval.v1.RetrievalService", timeout=120)
        gateways: dict[str, str] = {}
        for value in arms:
            env = {
                "HIPPO_GATEWAY_API_KEYS": json.dumps({KEY: "ab"}),
                "HIPPO_GATEWAY_EMBEDDING_ADDR": embedding.addr,
                "HIPPO_GATEWAY_RETRIEVAL_ADDR": retrieval.addr,
                "HIPPO_GATEWAY_SUMMARISER_ADDR": "",
                "HIPPO_GATEWAY_INJECTION_ADDR": "",
                "HIPPO_GATEWAY_AUDIT_ADDR": "",
                "HIPPO_GATEWAY_DATA_DIR": str(tmp / f"gateway-{len(gateways)}"),
                f"HIPPO_GATEWAY_{name.upper()}": value,
            }
            proc = stack.enter_context(service_process("hippo_gateway", "HIPPO_GATEWAY_", env))
            wait_for(proc.addr, "hippo.memory.v1.MemoryService", timeout=120)
            gateways[f"{name.upper()}={value}"] = proc.addr
        channels = {k: stack.enter_context(grpc.insecure_channel(a)) for k, a in gateways.items()}
        stubs = {k: memory_pb2_grpc.MemoryServiceStub(c) for k, c in channels.items()}
        order = list(stubs)
        started = time.perf_counter()
        for i in range(0, args.turns, 64):
            chunk = texts[i : min(i + 64, args.turns)]
            stubs[order[0]].Remember(
                memory_pb2.RememberRequest(
                    scope=memory_pb2.Scope(user_id=USER, session_id=f"s{i // 64}"),
                    turns=[memory_pb2.Turn(role=memory_pb2.ROLE_USER, text=t) for t in chunk],
                    wait_searchable=i + 64 >= args.turns,
                ),
                metadata=HEADERS,
                timeout=120,
            )
        print(
            f"{args.turns} turns remembered in {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
        )
        latencies: dict[str, list[float]] = {k: [] for k in stubs}
        for round_ in range(args.rounds + 1):  # the first round warms both, unmeasured
            for n, question in enumerate(questions):
                for arm in order if n % 2 else order[::-1]:
                    request = memory_pb2.RecallRequest(
                        scope=memory_pb2.Scope(user_id=USER), query=question, top_k=10
                    )
                    t = time.perf_counter()
                    stubs[arm].Recall(request, metadata=HEADERS, timeout=30)
                    if round_:
                        latencies[arm].append(1000 * (time.perf_counter() - t))
    print("\n| gateway | Recalls | p50 ms | p95 ms | mean ms |")
    print("|---|---|---|---|---|")
    for arm, values in latencies.items():
        p50, p95 = percentile(values, 50), percentile(values, 95)
        print(f"| {arm} | {len(values)} | {p50:.2f} | {p95:.2f} | {statistics.fmean(values):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
