"""Under load: Recall throughput and latency against concurrency, Remember throughput,
overload at 3x capacity, and a bulk replay, all on one cluster from `make run`.

One run, on this machine, with the embedding cache off (`HIPPO_EMBEDDING_CACHE_ENTRIES=0`)
and real LoCoMo questions (the dev data when present, else generated prose):

1. **Recall vs concurrency.** One user with `--turns` turns (default 10k: LoCoMo
   sentences made distinct, with their real vectors plus a little noise, written
   straight into retrieval as bench/recall_latency.py does) is asked the questions by
   1..32 closed-loop clients for `--seconds` each: requests/s, p50/p95/p99, and the CPU
   each service spent per Recall (from /proc: user + system time of each process).
2. **Remember throughput.** Clients send bulk Remembers of 64 real turns (embedding
   included) for `--seconds`; a refused call waits its RetryInfo and is sent again.
   Next to it, the embedding backend's own in-process batch-64 rate measured in this run
   (the physical limit: Remember cannot embed faster than the model does).
3. **Overload.** An open-loop generator offers 3x the best measured Recall rate for
   `--seconds`: goodput (OK/s) against capacity, the status of every refused call and
   whether it carried RetryInfo; then how long until one client's Recall is back to its
   quiet latency.
4. **Replay.** `hippo replay --concurrency 8` of an archive of ~`--replay-turns` turns
   (the dev conversations repeated under new ids): wall time, turns/s, exit code.

`--before REF` runs phases 1-3 on the code at git REF too (a worktree, as
bench/cluster.py does), side by side in the same run. Prints markdown tables; writes
bench/out/load.png and bench/out/load.json.

    .venv/bin/python bench/load.py [--turns 10000] [--seconds 8] [--levels 1,2,4,8,16,32]
        [--before REF] [--no-replay]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from cluster import worktree
from google.rpc import error_details_pb2, status_pb2
from recall_latency import corpus, fill, index_status

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_cli.cluster import LocalCluster, local_cluster
from hippo_core.testing import scrape, service_children
from hippo_embedding.adapters import load
from hippo_embedding.settings import EmbeddingSettings

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
OUT = ROOT / "bench" / "out"
KEY = (("x-api-key", "hippo-local-dev-key"),)
TENANT = "local"
USER = "load-user"
BIN = Path(sys.executable).parent


# What a loader waits out and resends; anything else is an error of the bench itself.
RETRIED = {
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def retry_delay(err: grpc.aio.AioRpcError) -> float | None:
    """RetryInfo's delay (s) from a refused call's status details, or None."""
    raw = dict(err.trailing_metadata() or ()).get("grpc-status-details-bin")
    if not isinstance(raw, bytes):
        return None
    for detail in status_pb2.Status.FromString(raw).details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToNanoseconds() / 1e9)
    return None


# -- CPU per service ------------------------------------------------------------------------


def service_pids(cluster: LocalCluster) -> dict[str, int]:
    """The launcher's service processes: name (retrieval, gateway, ...) -> pid."""
    assert cluster.launcher is not None
    found = service_children(cluster.launcher.pid)
    return {module.removeprefix("hippo_"): pid for module, pid in found.items()}


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / ticks
    return out


async def settle_graph(addr: str, start_within: float = 45.0) -> float:
    """Seconds until the background graph rebuild the load may start is done: measure
    the steady state a user meets, not the rebuild. The service looks every 30 s
    (graph_check_s); a build that has not started within `start_within` is not coming
    (the configuration's threshold is above the load)."""
    started = time.perf_counter()
    while True:
        status = await index_status(addr)
        if not status.rebuilding and status.vectors_outside_graph == 0:
            break
        if not status.rebuilding and time.perf_counter() - started > start_within:
            break
        await asyncio.sleep(1.0)
    return time.perf_counter() - started


# -- phases ---------------------------------------------------------------------------------


async def recall_level(
    addr: str, clients: int, seconds: float, questions: list[str]
) -> dict[str, Any]:
    """`clients` closed-loop clients asking for `seconds`."""
    latencies: list[float] = []
    codes: Counter[str] = Counter()
    stop = time.perf_counter() + seconds

    async def worker(n: int, stub: memory_pb2_grpc.MemoryServiceStub) -> None:
        rng = random.Random(n)
        while time.perf_counter() < stop:
            request = memory_pb2.RecallRequest(
                scope=memory_pb2.Scope(user_id=USER), query=rng.choice(questions), top_k=10
            )
            started = time.perf_counter()
            try:
                await stub.Recall(request, metadata=KEY, timeout=10)
                codes["OK"] += 1
                latencies.append(1000 * (time.perf_counter() - started))
            except grpc.aio.AioRpcError as err:
                codes[err.code().name] += 1
                await asyncio.sleep(retry_delay(err) or 0.05)

    async with grpc.aio.insecure_channel(addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        await stub.Recall(
            memory_pb2.RecallRequest(scope=memory_pb2.Scope(user_id=USER), query="warm up"),
            metadata=KEY,
            timeout=30,
        )
        started = time.perf_counter()
        await asyncio.gather(*(worker(n, stub) for n in range(clients)))
        elapsed = time.perf_counter() - started
    return {
        "clients": clients,
        "rps": len(latencies) / elapsed,
        "p50": pct(latencies, 50),
        "p95": pct(latencies, 95),
        "p99": pct(latencies, 99),
        "codes": dict(codes),
        "ok": len(latencies),
    }


async def remember_rate(
    addr: str, clients: int, seconds: float, texts: list[str], tag: str
) -> dict[str, Any]:
    """Bulk Remembers of 64 turns from `clients` clients; refused calls wait and resend."""
    stored, refused, latencies = 0, Counter[str](), []
    stop = time.perf_counter() + seconds

    async def worker(n: int, stub: memory_pb2_grpc.MemoryServiceStub) -> None:
        nonlocal stored
        call = 0
        while time.perf_counter() < stop:
            call += 1
            base = (n * 100_003 + call * 64) % len(texts)
            turns = [
                memory_pb2.Turn(
                    role=memory_pb2.ROLE_USER if i % 2 == 0 else memory_pb2.ROLE_ASSISTANT,
                    text=f"{texts[(base + i) % len(texts)]} ({tag} {n}.{call}.{i})",
                )
                for i in range(64)
            ]
            request = memory_pb2.RememberRequest(
                scope=memory_pb2.Scope(user_id=f"bulk-{tag}-{n}", session_id=f"s{call}"),
                turns=turns,
            )
            while True:
                started = time.perf_counter()
                try:
                    await stub.Remember(request, metadata=KEY, timeout=60)
                except grpc.aio.AioRpcError as err:
                    if err.code() not in RETRIED:  # a defect of the bench: stop, do not spin
                        raise
                    refused[err.code().name] += 1
                    await asyncio.sleep(retry_delay(err) or 0.2)
                    continue
                latencies.append(1000 * (time.perf_counter() - started))
                stored += 64
                break

    async with grpc.aio.insecure_channel(addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        started = time.perf_counter()
        await asyncio.gather(*(worker(n, stub) for n in range(clients)))
        elapsed = time.perf_counter() - started
    return {
        "seconds": elapsed,
        "turns_s": stored / elapsed,
        "p50": pct(latencies, 50),
        "p99": pct(latencies, 99),
        "refused": dict(refused),
    }


def embedder_rate(texts: list[str], seconds: float = 6.0) -> float:
    """The embedding backend's own batch-64 rate, in this process (texts/s)."""
    settings = EmbeddingSettings()
    encoder = load(settings)
    batch = texts[:64]
    encoder.encode(batch)  # warm
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        encoder.encode(texts[done % len(texts) : done % len(texts) + 64] or batch)
        done += 64
    return done / (time.perf_counter() - started)


async def overload(
    addr: str, rate: float, seconds: float, questions: list[str], quiet_p50: float
) -> dict[str, Any]:
    """Open loop at `rate` requests/s; then seconds until one client's Recall is quiet."""
    codes: Counter[str] = Counter()
    with_retry_info = 0
    pending: set[asyncio.Task[None]] = set()

    async def one(stub: memory_pb2_grpc.MemoryServiceStub, query: str) -> None:
        nonlocal with_retry_info
        request = memory_pb2.RecallRequest(
            scope=memory_pb2.Scope(user_id=USER), query=query, top_k=10
        )
        try:
            await stub.Recall(request, metadata=KEY, timeout=2)
            codes["OK"] += 1
        except grpc.aio.AioRpcError as err:
            codes[err.code().name] += 1
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_delay(err):
                with_retry_info += 1

    rng = random.Random(7)
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        started = time.perf_counter()
        sent = 0
        while (now := time.perf_counter()) - started < seconds:
            due = int((now - started) * rate) + 1
            while sent < due:
                task = asyncio.create_task(one(stub, rng.choice(questions)))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
            await asyncio.sleep(0.002)
        offered_for = time.perf_counter() - started
        await asyncio.gather(*pending)
        stopped = time.perf_counter()
        # Back to normal: 5 Recalls in a row within 1.5x the quiet p50.
        streak = 0
        recovered = None
        while time.perf_counter() - stopped < 30:
            t0 = time.perf_counter()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Recall(
                    memory_pb2.RecallRequest(
                        scope=memory_pb2.Scope(user_id=USER), query=rng.choice(questions)
                    ),
                    metadata=KEY,
                    timeout=10,
                )
            took = 1000 * (time.perf_counter() - t0)
            streak = streak + 1 if took <= 1.5 * quiet_p50 else 0
            if streak == 5:
                recovered = time.perf_counter() - stopped
                break
    refused = sum(v for k, v in codes.items() if k != "OK")
    return {
        "offered_rps": sent / offered_for,
        "goodput_rps": codes["OK"] / offered_for,
        "codes": dict(codes),
        "refused_with_retry_info": with_retry_info,
        "refused": refused,
        "recovered_s": recovered,
    }


def server_codes(url: str) -> dict[str, float]:
    """The gateway's Recall calls completed so far, by status code (its own metrics)."""
    out: dict[str, float] = {}
    for (name, labels), value in scrape(url).items():
        found = dict(labels)
        if name == "grpc_server_handled_total" and found.get("grpc_method") == "Recall":
            out[found["grpc_code"]] = out.get(found["grpc_code"], 0.0) + value
    return out


def archive(path: Path, turns: int) -> int:
    """The dev conversations repeated under new sample ids up to ~`turns` turns."""
    raw: list[dict[str, Any]] = json.loads(DATA.read_text())
    out, total, n = [], 0, 0
    while total < turns:
        conv = json.loads(json.dumps(raw[n % len(raw)]))
        conv["sample_id"] = f"load-{n}"
        out.append(conv)
        body = conv["conversation"]
        total += sum(
            len(v) for k, v in body.items() if k.startswith("session_") and isinstance(v, list)
        )
        n += 1
    path.write_text(json.dumps(out))
    return total


def replay(cluster: LocalCluster, turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "archive.json"
        total = archive(path, turns)
        started = time.perf_counter()
        done = subprocess.run(
            [str(BIN / "hippo"), "replay", str(path), "--concurrency", "8"],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        elapsed = time.perf_counter() - started
    return {
        "turns": total,
        "seconds": elapsed,
        "turns_s": total / elapsed,
        "exit": done.returncode,
        "tail": (done.stdout + done.stderr).strip().splitlines()[-3:],
    }


# -- one configuration ----------------------------------------------------------------------


@contextlib.contextmanager
def started(env: dict[str, str]) -> Iterator[LocalCluster]:
    with (
        tempfile.TemporaryDirectory(prefix="hippo-load-") as tmp,
        local_cluster(Path(tmp) / "var", env) as cluster,
    ):
        yield cluster


def load_user(cluster: LocalCluster, turns: int, texts: list[str], label: str) -> None:
    """USER's `turns` turns written straight into retrieval (the texts' real vectors plus
    a little noise), then the background graph rebuild they start waited out."""
    encoder = load(EmbeddingSettings())
    base = np.asarray(encoder.encode(texts), dtype=np.float32)
    del encoder
    retrieval = cluster.addrs["retrieval"]
    rate = asyncio.run(fill(retrieval, TENANT, [USER], turns, texts, base))
    print(f"[{label}] {turns} turns written ({rate:.0f}/s)", file=sys.stderr)
    waited = asyncio.run(settle_graph(retrieval))
    print(f"[{label}] vector graph settled after {waited:.0f} s", file=sys.stderr)


def measure(label: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    texts, questions = corpus()
    print(f"\n[{label}] starting a cluster", file=sys.stderr)
    with started(env) as cluster:
        pids = service_pids(cluster)
        load_user(cluster, args.turns, texts, label)
        levels = []
        for clients in args.levels:
            before = cpu_seconds(pids)
            row = asyncio.run(recall_level(cluster.gateway, clients, args.seconds, questions))
            after = cpu_seconds(pids)
            row["cpu_ms"] = {
                k: 1000 * (after[k] - before.get(k, after[k])) / max(1, row["ok"]) for k in after
            }
            levels.append(row)
            print(
                f"[{label}] Recall x{clients}: {row['rps']:.0f} req/s p50 {row['p50']:.1f} "
                f"p99 {row['p99']:.1f} ms",
                file=sys.stderr,
            )
        before = cpu_seconds(pids)
        tag = re.sub(r"[^A-Za-z0-9._:@-]", "-", label)  # user ids allow only these
        remember = asyncio.run(remember_rate(cluster.gateway, 4, args.seconds * 2, texts, tag))
        after = cpu_seconds(pids)
        stored = max(1.0, remember["turns_s"] * remember["seconds"])
        remember["cpu_ms"] = {
            k: 1000 * (after[k] - before.get(k, after[k])) / stored for k in after
        }
        print(f"[{label}] Remember {remember['turns_s']:.0f} turns/s", file=sys.stderr)
        capacity = max(r["rps"] for r in levels)
        quiet = levels[0]["p50"]
        gateway_metrics = cluster.metrics["gateway"]
        before_codes = server_codes(gateway_metrics)
        before = {**cpu_seconds(pids), "load generator": sum(os.times()[:2])}
        over = asyncio.run(overload(cluster.gateway, 3 * capacity, args.seconds, questions, quiet))
        after = {**cpu_seconds(pids), "load generator": sum(os.times()[:2])}
        after_codes = server_codes(gateway_metrics)
        # Where the two cores went while overloaded (the generator included: it shares
        # them), per offered call: refusing must cost far less than serving.
        offered = max(1, sum(over["codes"].values()))
        over["cpu_ms"] = {k: 1000 * (after[k] - before.get(k, after[k])) / offered for k in after}
        # What the gateway itself answered: a call the client timed out on while the
        # gateway still served it (the load generator shares these 2 cores) shows here
        # as OK, and one the gateway ran past its deadline as DEADLINE_EXCEEDED.
        over["server_codes"] = {
            k: int(v - before_codes.get(k, 0.0))
            for k, v in after_codes.items()
            if v - before_codes.get(k, 0.0) > 0
        }
        print(f"[{label}] overload goodput {over['goodput_rps']:.0f}/s", file=sys.stderr)
        replayed = (
            replay(cluster, args.replay_turns)
            if args.replay and not label.startswith("@")
            else None
        )
    return {
        "config": label,
        "levels": levels,
        "remember": remember,
        "capacity": capacity,
        "overload": over,
        "replay": replayed,
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        xs = [lv["clients"] for lv in r["levels"]]
        axes[0].plot(xs, [lv["rps"] for lv in r["levels"]], marker="o", label=r["config"])
        axes[1].plot(xs, [lv["p50"] for lv in r["levels"]], marker="o", label=f"p50 {r['config']}")
        axes[1].plot(
            xs, [lv["p99"] for lv in r["levels"]], marker="x", ls="--", label=f"p99 {r['config']}"
        )
    axes[0].set_title("Recall throughput (requests/s)")
    axes[1].set_title("Recall latency (ms)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(rows: list[dict[str, Any]], embed_rate: float) -> None:
    print("\n## Recall vs concurrency (cache off)\n")
    print("| config | clients | req/s | p50 ms | p95 ms | p99 ms | not OK | CPU ms per Recall |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        for lv in r["levels"]:
            bad = sum(v for k, v in lv["codes"].items() if k != "OK")
            cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(lv["cpu_ms"].items()) if v >= 0.05)
            print(
                f"| {r['config']} | {lv['clients']} | {lv['rps']:.0f} | {lv['p50']:.1f} | "
                f"{lv['p95']:.1f} | {lv['p99']:.1f} | {bad} | {cpu} |"
            )
    print("\n## Remember (bulk calls of 64 turns, 4 clients)\n")
    print(f"embedding backend in-process, batch 64: {embed_rate:.0f} texts/s\n")
    print("| config | turns/s | share of the embedder's rate | p50 / p99 ms per call | refused "
          "| CPU ms per turn |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in rows:
        m = r["remember"]
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(m["cpu_ms"].items()) if v >= 0.05)
        print(
            f"| {r['config']} | {m['turns_s']:.0f} | {100 * m['turns_s'] / embed_rate:.0f}% | "
            f"{m['p50']:.0f} / {m['p99']:.0f} | {m['refused'] or 'none'} | {cpu} |"
        )
    print("\n## Overload (open loop at 3x the best Recall rate, 2 s deadlines)\n")
    print("| config | capacity req/s | offered req/s | goodput req/s | goodput / capacity "
          "| statuses (client) | statuses (gateway) | refused with RetryInfo "
          "| back to quiet latency after | CPU ms per offered call |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        o = r["overload"]
        back = "not within 30 s" if o["recovered_s"] is None else f"{o['recovered_s']:.1f} s"
        print(
            f"| {r['config']} | {r['capacity']:.0f} | {o['offered_rps']:.0f} | "
            f"{o['goodput_rps']:.0f} | {100 * o['goodput_rps'] / r['capacity']:.0f}% | "
            f"{o['codes']} | {o.get('server_codes', {})} | "
            f"{o['refused_with_retry_info']} of {o['refused']} | {back} | "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(o.get("cpu_ms", {}).items()) if v >= 0.05)
            + " |"
        )
    for r in rows:
        if r["replay"]:
            p = r["replay"]
            print(
                f"\n## Replay ({r['config']})\n\n`hippo replay --concurrency 8`: {p['turns']} "
                f"turns in {p['seconds']:.0f} s ({p['turns_s']:.0f} turns/s), exit code "
                f"{p['exit']}; last lines: {p['tail']}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000, help="turns of the Recall user")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument(
        "--levels",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 2, 4, 8, 16, 32],
        help="concurrent Recall clients, comma-separated",
    )
    parser.add_argument("--replay-turns", type=int, default=9000, help="turns replayed")
    parser.add_argument("--no-replay", dest="replay", action="store_false")
    parser.add_argument("--before", help="also phases 1-3 on the code at this git ref")
    parser.add_argument(
        "--before-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also phases 1-3 on this code with this setting (repeatable), e.g. "
        "HIPPO_RETRIEVAL_GRAPH_MIN_POINTS=20000",
    )
    args = parser.parse_args()
    if not DATA.exists():
        args.replay = False  # the archive is built from the dev conversations
    env = {"HIPPO_EMBEDDING_CACHE_ENTRIES": "0"}
    rows = []
    if args.before:
        with worktree(args.before) as pythonpath:
            rows.append(measure(f"@{args.before[:7]}", {**env, "PYTHONPATH": pythonpath}, args))
    if args.before_env:
        changed = dict(item.split("=", 1) for item in args.before_env)
        rows.append(measure("@env:" + ",".join(args.before_env), {**env, **changed}, args))
    rows.append(measure("now", env, args))
    texts, _ = corpus()
    embed_rate = embedder_rate(texts)
    report(rows, embed_rate)
    OUT.mkdir(parents=True, exist_ok=True)
    plot(rows, OUT / "load.png")
    (OUT / "load.json").write_text(json.dumps({"rows": rows, "embedder": embed_rate}, indent=1))
    print(f"\nplot: {OUT / 'load.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
