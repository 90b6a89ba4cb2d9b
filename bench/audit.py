"""Audit log: append throughput and latency under concurrent writers, and Verify speed.

A real audit service is started (its own process, a temporary data dir on local disk,
WAL + synchronous=FULL). Writers call Append over loopback gRPC, one entry per call (what
the gateway's spool drainer does when the log is keeping up), each waiting for its reply
before the next: the latency is the caller's, including the group commit's fsync. Entries
look like the gateway's recall entries (ids, scores, ranks, a private fingerprint sealed
with AES-GCM). Then the log is grown in bulk (Appends of 1000 entries) and Verify checks
it whole, chain and signed checkpoints, through gRPC.

Targets (issue 6): append p99 <= 10 ms at 8 writers; Verify >= 100k entries/s.

    .venv/bin/python bench/audit.py [--seconds 10] [--writers 1,8,64] [--verify-size 200000]

Prints a table; writes bench/out/audit.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import struct_pb2
from stats import percentile

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_core import client
from hippo_core.testing import service_process, wait_for

OUT = Path(__file__).resolve().parent / "out"
SERVICE = "hippo.audit.v1.AuditService"


def entry(i: int, writer: int) -> audit_pb2.NewEntry:
    body = struct_pb2.Struct()
    body.update(
        {
            "mode": "hybrid",
            "top_k": 10,
            "candidates": {"lexical": 23, "semantic": 100},
            "hits": [
                {
                    "memory_id": f"{uuid.uuid4()}",
                    "rank": r,
                    "fused_score": 0.41 / r,
                    "lexical_rank": r,
                    "semantic_rank": r + 1,
                    "time_us": 1_714_521_600_000_000 + r,
                }
                for r in range(1, 6)
            ],
        }
    )
    out = audit_pb2.NewEntry(
        tenant="bench",
        actor="gateway",
        event_type="recall",
        user_id=f"user-{writer % 50}",
        session_id="s1",
        memory_ids=[f"m-{i}-{k}" for k in range(5)],
        body=body,
        idempotency_key=uuid.uuid4().hex,
    )
    if i % 2:
        out.private_body.update({"query_fingerprint": uuid.uuid4().hex})
    return out


def appends(addr: str, writers: int, seconds: float, method: str = "Append") -> dict[str, Any]:
    """`writers` threads, each with blocking calls on one shared channel. Requests are
    built and serialised beforehand, so the client's own Python time (it shares the CPUs
    with the service) is not charged to the service's latency. `method="Head"` measures
    the floor: a call that does nothing, through the same server, interceptors and
    client."""
    per_writer = int(seconds * 2000) + 1  # more than a writer can send in `seconds`
    prepared = [
        [
            audit_pb2.AppendRequest(entries=[entry(i, w)]).SerializeToString()
            if method == "Append"
            else b""
            for i in range(per_writer)
        ]
        for w in range(writers)
    ]
    latencies: list[float] = []
    lock = threading.Lock()
    with grpc.insecure_channel(addr) as channel:
        call = channel.unary_unary(
            f"/hippo.audit.v1.AuditService/{method}",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        for w in range(min(writers, 50)):  # warm-up: connection, each user's first key
            call(audit_pb2.AppendRequest(entries=[entry(0, w)]).SerializeToString(), timeout=30)
        stop = time.perf_counter() + seconds

        def writer(w: int) -> None:
            mine = []
            for raw in prepared[w]:
                if time.perf_counter() >= stop:
                    break
                started = time.perf_counter()
                call(raw, timeout=30)
                mine.append(time.perf_counter() - started)
            with lock:
                latencies.extend(mine)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - began
    return {
        "writers": writers,
        "appends": len(latencies),
        "per_second": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "mean_ms": statistics.fmean(latencies) * 1e3,
    }


def fsync_baseline(folder: str, commits: int = 300) -> dict[str, float]:
    """One-row SQLite commits (WAL, synchronous=FULL) on the same disk: the floor under
    any durable append here."""
    conn = sqlite3.connect(Path(folder) / "baseline.sqlite3", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (x BLOB)")
    times = []
    for _ in range(commits):
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 600,))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - started)
    conn.close()
    return {"p50_ms": percentile(times, 50) * 1e3, "p99_ms": percentile(times, 99) * 1e3}


async def grow_and_verify(addr: str, size: int) -> dict[str, Any]:
    async with client.channel(addr, max_message_bytes=64 * 1024 * 1024) as channel:
        stub = audit_pb2_grpc.AuditServiceStub(channel)
        head = await stub.Head(audit_pb2.HeadRequest(), timeout=10)
        i = head.seq
        while i < size:
            n = min(1000, size - i)
            await stub.Append(
                audit_pb2.AppendRequest(entries=[entry(i + k, k) for k in range(n)]), timeout=120
            )
            i += n
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            reply = await stub.Verify(audit_pb2.VerifyRequest(), timeout=3600)
            runs.append(time.perf_counter() - started)
            assert reply.ok, reply
        best = min(runs)
        return {
            "entries": reply.entries_checked,
            "checkpoints": reply.checkpoints_checked,
            "seconds": best,
            "per_second": reply.entries_checked / best,
            "runs_s": [round(r, 3) for r in runs],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per writer level")
    parser.add_argument("--writers", default="1,8,64")
    parser.add_argument("--verify-size", type=int, default=200_000)
    args = parser.parse_args()
    levels = [int(w) for w in args.writers.split(",")]
    with tempfile.TemporaryDirectory(prefix="audit-bench-") as data:
        floor = fsync_baseline(data)
        env = {"HIPPO_AUDIT_DATA_DIR": data, "HIPPO_AUDIT_LOG_LEVEL": "warning"}
        with service_process("hippo_audit", "HIPPO_AUDIT_", env) as proc:
            wait_for(proc.addr, SERVICE, timeout=60)
            results = [appends(proc.addr, w, args.seconds) for w in levels]
            floors = [appends(proc.addr, w, args.seconds / 2, "Head") for w in levels]
            verify = asyncio.run(grow_and_verify(proc.addr, args.verify_size))
    print(
        f"\nbare SQLite commit on this disk (WAL, synchronous=FULL): p50 {floor['p50_ms']:.2f} ms,"
        f" p99 {floor['p99_ms']:.2f} ms"
    )
    print("\nappend (one entry per call, gRPC, WAL + synchronous=FULL, group commit)")
    print(
        f"{'writers':>8} {'appends/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}"
        f"   | no-op Head: {'calls/s':>8} {'p50 ms':>7} {'p99 ms':>7}"
    )
    for r, f in zip(results, floors, strict=True):
        print(
            f"{r['writers']:>8} {r['per_second']:>10.0f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>8.2f} {r['mean_ms']:>8.2f}   |             {f['per_second']:>8.0f} "
            f"{f['p50_ms']:>7.2f} {f['p99_ms']:>7.2f}"
        )
    print(
        f"\nverify (chain + {verify['checkpoints']} checkpoints, gRPC): {verify['entries']} "
        f"entries in {verify['seconds']:.2f} s = {verify['per_second']:,.0f} entries/s"
    )
    eight = next((r for r in results if r["writers"] == 8), None)
    if eight is not None:
        hit = "met" if eight["p99_ms"] <= 10 else "MISSED"
        print(f"target append p99 <= 10 ms at 8 writers: {hit} ({eight['p99_ms']:.2f} ms)")
    hit = "met" if verify["per_second"] >= 100_000 else "MISSED"
    print(f"target verify >= 100k entries/s: {hit} ({verify['per_second']:,.0f}/s)")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "audit.json").write_text(
        json.dumps({"fsync": floor, "append": results, "head": floors, "verify": verify}, indent=2)
    )


if __name__ == "__main__":
    main()
