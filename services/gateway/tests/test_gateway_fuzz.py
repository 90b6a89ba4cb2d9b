"""A fixed sample of bench/fuzz.py against the gateway harness (embedding, retrieval,
audit and gateway processes): valid, boundary and malformed requests, field-level and
wire-level, for every public RPC. No request may reach INTERNAL or UNKNOWN or hang, and
every service must still be SERVING afterwards. The full run (10,000 per RPC on the whole
cluster) is the benchmark: docs/security.md#fuzzing."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from gateway_harness import AUDIT, EMBEDDING, GATEWAY, RETRIEVAL, Cluster, key_of

PER_RPC = 200
SEED = 20240614


def load_fuzz() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "bench" / "fuzz.py"
    spec = importlib.util.spec_from_file_location("hippo_bench_fuzz", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_the_generator_is_reproducible_and_covers_every_kind() -> None:
    fuzz = load_fuzz()
    first = [fuzz.Generator(7).request("Remember") for _ in range(1)]
    a, b = fuzz.Generator(7), fuzz.Generator(7)
    sample = [(a.request(r.name), b.request(r.name)) for r in fuzz.RPCS for _ in range(50)]
    assert all(x == y for x, y in sample) and first
    kinds = {x[0] for x, _ in sample}
    assert kinds == {"valid", "field", "wire"}


def test_a_fixed_fuzz_sample_finds_no_internal_error_no_hang_and_no_service_down(
    cluster: Cluster,
) -> None:
    """Every RPC, PER_RPC requests each (Chat too: without an LLM host in the harness it
    is refused or unavailable before generating), 16 in flight."""
    fuzz = load_fuzz()
    health = {
        "embedding": (cluster.embedding.addr, EMBEDDING),
        "retrieval": (cluster.retrieval.addr, RETRIEVAL),
        "audit": (cluster.audit.addr, AUDIT),
        "gateway": (cluster.gateway.addr, GATEWAY),
    }
    plan = {r.name: PER_RPC for r in fuzz.RPCS}
    report = asyncio.run(
        fuzz.fuzz(
            cluster.gateway.addr,
            key_of("acme"),
            plan,
            SEED,
            concurrency=16,
            hang_seconds=30,
            health=health,
        )
    )
    print(report.table())
    problems = {
        name: t.examples for name, t in report.tallies.items() if t.internal or t.unknown or t.hangs
    }
    assert problems == {}, problems
    assert report.health == dict.fromkeys(health, "SERVING")
    for name, tally in report.tallies.items():
        assert sum(tally.codes.values()) == PER_RPC, name
        assert tally.codes["INVALID_ARGUMENT"] > 0, name  # the malformed ones were refused
    assert report.tallies["Remember"].codes["OK"] > 0  # and the valid ones served
    assert report.tallies["Recall"].codes["OK"] > 0
