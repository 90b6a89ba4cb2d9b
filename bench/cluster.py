"""Cluster mode against the embedded default, one replica against two, and failover.

Three local clusters are started one after another on this machine, through the same
launcher as `make run` / `make run-cluster`:
  embedded    `hippo up`: SQLite, one process per service
  cluster x1  `hippo up --cluster --replicas 1`: PostgreSQL, one process per service
  cluster x2  `hippo up --cluster --replicas 2`: PostgreSQL, two replicas of every service
For each: Remember throughput (turns/s) and p50/p99 per call (clients concurrent, each
sending one LoCoMo session's turns per call, the embedding included), then Recall
throughput and p50/p99 with 1 and 8 concurrent clients (LoCoMo questions over the loaded
turns, embedding cache off so every query is embedded).

Failover (cluster x2 only): while clients run Recall and Remember (idempotent: client ids;
each retries UNAVAILABLE with backoff, as the API's contract says callers should), one
replica of each service in turn is killed with SIGKILL; the launcher restarts it, as
Kubernetes would. Reported: calls that failed after their retries (target 0), calls that
needed a retry, and per kill the seconds until the replica is SERVING again.

`--before REF` adds the embedded default as built at git REF (a worktree, run from this
venv with its sources first on PYTHONPATH), measured in the same run: the embedded
default must not get slower.

On 2 cores the x2 column shows the overhead of twice the processes on the same cores,
not scaling. Run:

    .venv/bin/python bench/cluster.py [--turns 1200] [--queries 300] [--before REF]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_cli import locomo, replay
from hippo_cli.cluster import LocalCluster, local_cluster
from hippo_cli.health import check
from hippo_cli.registry import SERVICES
from hippo_cli.settings import CliSettings

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
OUT = ROOT / "bench" / "out"
KEY = (("x-api-key", CliSettings().api_key),)
RETRIED = {grpc.StatusCode.UNAVAILABLE}


def conversations() -> list[locomo.Conversation]:
    if DATA.exists():
        return locomo.load(DATA)
    sys.path.insert(0, str(ROOT / "tests"))
    import locomo_sample  # type: ignore[import-not-found]  # the tests' archive

    path = Path(tempfile.mkdtemp()) / "sample.json"
    locomo_sample.write(path, conversations=6)
    return locomo.load(path)


@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    retried: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)


async def call(
    tally: Tally,
    method: Callable[..., Awaitable[Any]],
    request: Any,
    timeout: float,
    *,
    deadline_s: float = 60,
) -> Any:
    """One idempotent call, retried on UNAVAILABLE with capped backoff until it succeeds
    or `deadline_s` passes (then it counts as failed)."""
    started = time.perf_counter()
    wait = 0.05
    while True:
        try:
            result = await method(request, metadata=KEY, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in RETRIED and time.perf_counter() - started < deadline_s:
                tally.retried += 1
                await asyncio.sleep(wait)
                wait = min(wait * 2, 1.0)
                continue
            tally.failed += 1
            tally.errors[exc.code().name] = tally.errors.get(exc.code().name, 0) + 1
            return None
        tally.latencies_ms.append(1000 * (time.perf_counter() - started))
        return result


def remember_requests(
    convs: list[locomo.Conversation], turns: int, prefix: str
) -> list[memory_pb2.RememberRequest]:
    out: list[memory_pb2.RememberRequest] = []
    count = 0
    for conv in convs:
        for request in replay.requests(conv, user_prefix=prefix):
            out.append(request)
            count += len(request.turns)
            if count >= turns:
                return out
    return out


async def run_remember(
    target: str, requests: list[memory_pb2.RememberRequest], clients: int
) -> tuple[Tally, float]:
    tally = Tally()
    queue = list(requests)
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(
        target, options=[("grpc.lb_policy_name", "round_robin")]
    ) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        async def worker() -> None:
            while queue:
                request = queue.pop(0)
                await call(tally, stub.Remember, request, 60)

        await asyncio.gather(*(worker() for _ in range(clients)))
    turns = sum(len(r.turns) for r in requests)
    return tally, turns / (time.perf_counter() - started)


async def run_recall(
    target: str, users: list[str], questions: list[str], clients: int
) -> tuple[Tally, float]:
    tally = Tally()
    queue = list(questions)
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(
        target, options=[("grpc.lb_policy_name", "round_robin")]
    ) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        async def worker(n: int) -> None:
            while queue:
                q = queue.pop(0)
                request = memory_pb2.RecallRequest(
                    scope=memory_pb2.Scope(user_id=users[n % len(users)]), query=q, top_k=10
                )
                await call(tally, stub.Recall, request, 30)

        await asyncio.gather(*(worker(n) for n in range(clients)))
    return tally, len(questions) / (time.perf_counter() - started)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def failover(
    cluster: LocalCluster,
    remember: list[memory_pb2.RememberRequest],
    users: list[str],
    questions: list[str],
    every_s: float,
) -> tuple[Tally, Tally, list[dict[str, Any]]]:
    """Kill one replica of each service in turn under load; measure what callers see."""
    stop = asyncio.Event()
    recalls, writes = Tally(), Tally()
    kills: list[dict[str, Any]] = []
    async with grpc.aio.insecure_channel(
        cluster.gateway, options=[("grpc.lb_policy_name", "round_robin")]
    ) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)

        async def reader(n: int) -> None:
            while not stop.is_set():
                q = questions[random.randrange(len(questions))]
                request = memory_pb2.RecallRequest(
                    scope=memory_pb2.Scope(user_id=users[n % len(users)]), query=q, top_k=10
                )
                await call(recalls, stub.Recall, request, 30)

        async def writer(n: int) -> None:
            i = n
            while not stop.is_set():
                request = remember[i % len(remember)]  # again and again: deduplicated
                i += 2
                await call(writes, stub.Remember, request, 60)

        tasks = [asyncio.create_task(reader(n)) for n in range(6)]
        tasks += [asyncio.create_task(writer(n)) for n in range(2)]
        await asyncio.sleep(every_s)
        full_names = {s.name: s.full_name for s in SERVICES}
        for spec in SERVICES:
            cluster.refresh()
            victim = random.choice(cluster.replicas[spec.name])
            killed_at = time.perf_counter()
            os.kill(victim.pid, signal.SIGKILL)
            back = None
            while time.perf_counter() - killed_at < 180:
                await asyncio.sleep(0.2)
                cluster.refresh()
                now = next(e for e in cluster.replicas[spec.name] if e.replica == victim.replica)
                if now.pid != victim.pid and await check(now.addr, full_names[spec.name]) == (
                    "SERVING"
                ):
                    back = time.perf_counter() - killed_at
                    break
            kills.append({"replica": victim.name, "serving_again_s": back})
            print(f"  killed {victim.name}: SERVING again after {back}", file=sys.stderr)
            await asyncio.sleep(every_s)
        stop.set()
        await asyncio.gather(*tasks)
    return recalls, writes, kills


def measure(
    label: str, extra: dict[str, str], cluster_mode: bool, replicas: int, args: Any
) -> dict[str, Any]:
    convs = conversations()
    questions = [q.question for c in convs for q in c.questions] or [
        t.text for c in convs for t in c.turns
    ]
    questions = (questions * (args.queries // len(questions) + 1))[: args.queries]
    prefix = "".join(c for c in label if c.isalnum()) + "-"
    # Embedded: the launcher's plain call, which an older build's launcher understands too.
    mode: dict[str, Any] = {"cluster": True, "replicas": replicas} if cluster_mode else {}
    requests = remember_requests(convs, args.turns, prefix)
    users = sorted({r.scope.user_id for r in requests})
    row: dict[str, Any] = {"config": label}
    with (
        tempfile.TemporaryDirectory(prefix="hippo-bench-cluster-") as tmp,
        local_cluster(Path(tmp), extra, **mode) as cluster,
    ):
        print(f"{label}: up", file=sys.stderr)
        tally, rate = asyncio.run(run_remember(cluster.gateway, requests, clients=4))
        row.update(
            remember_turns_s=rate,
            remember_p50_ms=pct(tally.latencies_ms, 50),
            remember_p99_ms=pct(tally.latencies_ms, 99),
            remember_failed=tally.failed,
        )
        time.sleep(2)  # let the projections settle before reading
        for clients in (1, 8):
            tally, rate = asyncio.run(run_recall(cluster.gateway, users, questions, clients))
            row[f"recall{clients}_rps"] = rate
            row[f"recall{clients}_p50_ms"] = pct(tally.latencies_ms, 50)
            row[f"recall{clients}_p99_ms"] = pct(tally.latencies_ms, 99)
            row[f"recall{clients}_failed"] = tally.failed
        if args.failover and cluster_mode and replicas > 1:
            recalls, writes, kills = asyncio.run(
                failover(cluster, requests, users, questions, args.kill_every)
            )
            row["failover"] = {
                "recall_calls": len(recalls.latencies_ms) + recalls.failed,
                "recall_failed": recalls.failed,
                "recall_retried": recalls.retried,
                "remember_calls": len(writes.latencies_ms) + writes.failed,
                "remember_failed": writes.failed,
                "remember_retried": writes.retried,
                "errors": {**recalls.errors, **writes.errors},
                "recall_p99_ms": pct(recalls.latencies_ms, 99),
                "kills": kills,
            }
    return row


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[str]:
    """A checkout of `ref` beside this one; yields the PYTHONPATH that runs its packages
    (their sources first, ahead of this venv's editable installs)."""
    where = Path(tempfile.mkdtemp(prefix="hippo-before-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(where), ref], cwd=ROOT, check=True)
    try:
        paths = sorted(str(p) for p in where.glob("*/*/src") if p.is_dir())
        yield os.pathsep.join(paths)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=False)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["config"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    x = np.arange(len(rows))
    axes[0].bar(x, [r["remember_turns_s"] for r in rows], color="tab:blue")
    axes[0].set_title("Remember (turns/s)")
    axes[1].bar(x - 0.2, [r["recall1_rps"] for r in rows], 0.4, label="1 client")
    axes[1].bar(x + 0.2, [r["recall8_rps"] for r in rows], 0.4, label="8 clients")
    axes[1].set_title("Recall (requests/s)")
    axes[1].legend()
    for n, key in ((1, "recall1"), (8, "recall8")):
        axes[2].plot(x, [r[f"{key}_p50_ms"] for r in rows], marker="o", label=f"p50, {n} client")
        axes[2].plot(x, [r[f"{key}_p99_ms"] for r in rows], marker="x", ls="--", label=f"p99, {n}")
    axes[2].set_title("Recall latency (ms)")
    axes[2].legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(x, labels)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1200, help="turns written per cluster")
    parser.add_argument("--queries", type=int, default=300, help="Recall calls per level")
    parser.add_argument("--kill-every", type=float, default=8.0, help="seconds between kills")
    parser.add_argument("--no-failover", dest="failover", action="store_false")
    parser.add_argument("--before", help="also the embedded default at this git ref")
    args = parser.parse_args()
    no_cache = {"HIPPO_EMBEDDING_CACHE_ENTRIES": "0"}
    rows = []
    if args.before:
        with worktree(args.before) as pythonpath:
            before = {**no_cache, "PYTHONPATH": pythonpath}
            rows.append(measure(f"embedded @{args.before[:7]}", before, False, 1, args))
    rows += [
        measure("embedded", no_cache, False, 1, args),
        measure("cluster x1", no_cache, True, 1, args),
        measure("cluster x2", no_cache, True, 2, args),
    ]
    print("\n| config | Remember turns/s | Remember p50 / p99 ms | Recall 1 client req/s "
          "| p50 / p99 ms | Recall 8 clients req/s | p50 / p99 ms | failed calls |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        failed = r["remember_failed"] + r["recall1_failed"] + r["recall8_failed"]
        print(
            f"| {r['config']} | {r['remember_turns_s']:.1f} | {r['remember_p50_ms']:.0f} / "
            f"{r['remember_p99_ms']:.0f} | {r['recall1_rps']:.1f} | {r['recall1_p50_ms']:.1f} / "
            f"{r['recall1_p99_ms']:.1f} | {r['recall8_rps']:.1f} | {r['recall8_p50_ms']:.1f} / "
            f"{r['recall8_p99_ms']:.1f} | {failed} |"
        )
    base = next(r for r in rows if r["config"] == "embedded")["recall1_p50_ms"]
    for r in rows:
        if r["config"] == "embedded":
            continue
        print(
            f"\nRecall p50 (1 client), {r['config']} / embedded: {r['recall1_p50_ms'] / base:.2f}x"
        )
    for r in rows:
        fo = r.get("failover")
        if not fo:
            continue
        print(f"\nFailover ({r['config']}): one replica of each service killed (SIGKILL) in turn")
        print(
            f"  Recall: {fo['recall_calls']} calls, {fo['recall_failed']} failed after retries, "
            f"{fo['recall_retried']} retries, p99 {fo['recall_p99_ms']:.0f} ms"
        )
        print(
            f"  Remember: {fo['remember_calls']} calls, {fo['remember_failed']} failed after "
            f"retries, {fo['remember_retried']} retries; errors {fo['errors'] or 'none'}"
        )
        print("\n| replica killed | SERVING again after (s) |")
        print("|---|---|")
        for k in fo["kills"]:
            back = "never" if k["serving_again_s"] is None else f"{k['serving_again_s']:.1f}"
            print(f"| {k['replica']} | {back} |")
        served = [k["serving_again_s"] for k in fo["kills"] if k["serving_again_s"] is not None]
        if served:
            print(f"\nmedian seconds to SERVING again: {statistics.median(served):.1f}")
    OUT.mkdir(parents=True, exist_ok=True)
    plot(rows, OUT / "cluster.png")
    print(f"\nplot: {OUT / 'cluster.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
