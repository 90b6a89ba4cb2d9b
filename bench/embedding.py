"""Embedding service benchmark: the cost of the gRPC edge over calling the model in-process.

For each backend (`onnx`, `torch`) and each model thread count it measures, back to back
on the same texts (distinct texts per call, LoCoMo dev turns):

* in-process: `adapters.load(EmbeddingSettings(...))` in this process, then
  batch 1 (N single-text calls: texts/s, p50, p95) and batch 64 (M calls: texts/s);
* gRPC: `python -m hippo_embedding` as a subprocess on free 127.0.0.1 ports with the
  cache off (`HIPPO_EMBEDDING_CACHE_ENTRIES=0`), the same two loads through a sync
  client (vectors decoded with numpy on every call), then C concurrent single-text
  clients (micro-batching under load; requests per model call from the server's
  `hippo_embedding_batch_requests` histogram), and the server's RSS;
* RSS of the in-process path: the peak RSS (VmHWM) of a fresh child process that only loads the
  encoder and embeds one batch.

Targets (gRPC / in-process, same backend and threads):
  * batch 64 throughput ratio >= 0.90;
  * batch 1 p50 difference <= 2.0 ms.

Run:
    .venv/bin/python bench/embedding.py                  # onnx and torch, 1 thread
    .venv/bin/python bench/embedding.py --threads 1,2
    .venv/bin/python bench/embedding.py --quick          # smoke run

Each configuration runs --rounds times (default 3), in-process and gRPC alternating;
every figure is the median over rounds, since this 2-core machine is noisy (+-10%).

Writes a table to stdout, every figure to `bench/out/embedding.json` (`--json`) and a bar
chart to `bench/out/embedding.png` (`--png`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hippo_core import testing
from hippo_core.listen import reserve_port

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"
OUT_DIR = ROOT / "bench" / "out"
HOST = "127.0.0.1"
SERVICE = "hippo.embedding.v1.EmbeddingService"
DIMENSION = 384
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # testing.scrape()
WARM_CALLS = 5  # single-text warm-up calls before each measured path
INFO_CALLS = 50  # model-free Info RPCs: the round-trip floor of the gRPC path
TARGET_RATIO = 0.90
TARGET_P50_MS = 2.0

# ru_maxrss survives fork + exec (a child forked from a benchmark process that holds torch
# starts with the parent's high-water mark), so the peak is VmHWM, which exec resets.
RSS_CHILD = """
import json, resource, sys
from hippo_embedding import adapters
from hippo_embedding.settings import EmbeddingSettings
enc = adapters.load(EmbeddingSettings(backend=sys.argv[1], threads=int(sys.argv[2])))
texts = json.loads(sys.stdin.read())
vectors = enc.encode(texts)
assert vectors.shape == (len(texts), enc.dimension)
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({
    "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "vm_hwm_kb": int(status["VmHWM"].split()[0]),
    "vm_rss_kb": int(status["VmRSS"].split()[0]),
}))
"""


# --------------------------------------------------------------------------- corpus


def load_texts(path: Path, need: int) -> tuple[list[str], str]:
    """`need` distinct texts: LoCoMo turns (seeded shuffle), else synthetic sentences."""
    texts: list[str] = []
    source = "synthetic"
    if path.is_file():
        samples = json.loads(path.read_text(encoding="utf-8"))
        for sample in samples:
            conversation = sample.get("conversation", {})
            sessions = [k for k in conversation if re.fullmatch(r"session_\d+", k)]
            for name in sorted(sessions, key=lambda k: int(k.split("_")[1])):
                for turn in conversation[name]:
                    text = turn.get("text") if isinstance(turn, dict) else None
                    if isinstance(text, str) and text.strip():
                        texts.append(text)
        texts = list(dict.fromkeys(texts))
        source = str(path)
    rng = random.Random(0)
    rng.shuffle(texts)
    if not texts:
        subjects = ["Caroline", "Melanie", "My sister", "The team", "Our neighbour", "Jon"]
        verbs = ["painted", "talked about", "planned", "remembered", "finished", "visited"]
        objects = [
            "a sunset over the lake",
            "the charity race",
            "her first pottery class",
            "a trip to the mountains",
            "the new job offer",
            "an old family recipe",
        ]
        texts = [
            f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} last week."
            for _ in range(32)
        ]
    out = list(texts)
    round_ = 1
    while len(out) < need:  # too few turns: numbered variants stay distinct
        out.extend(f"{t} (variant {round_})" for t in texts)
        round_ += 1
    return out[:need], source


@dataclass(frozen=True)
class Plan:
    b1: list[str]  # one text per call
    big: list[list[str]]  # batch-size texts per call
    concurrent: list[str]  # one text per request
    warm: list[str]  # warm-up only, never measured


def make_plan(texts: list[str], n: int, m: int, batch: int, requests: int) -> Plan:
    i = 0

    def take(k: int) -> list[str]:
        nonlocal i
        part = texts[i : i + k]
        i += k
        return part

    b1 = take(n)
    big = [take(batch) for _ in range(m)]
    concurrent = take(requests)
    warm = take(max(batch, WARM_CALLS))
    return Plan(b1, big, concurrent, warm)


# --------------------------------------------------------------------------- results


@dataclass
class PathResult:
    backend: str
    threads: int
    path: str  # "in-process" | "grpc"
    b1_tps: float = 0.0
    b1_p50_ms: float = 0.0
    b1_p95_ms: float = 0.0
    b1_mean_ms: float = 0.0
    b1_server_ms: float | None = None  # grpc: mean server handling time of a b1 Embed
    b1_forward_ms: float | None = None  # grpc: mean model call inside it
    big_tps: float = 0.0
    big_call_ms: float = 0.0
    concurrent_tps: float | None = None
    concurrent_p50_ms: float | None = None
    concurrent_p95_ms: float | None = None
    reqs_per_batch: float | None = None
    texts_per_batch: float | None = None
    rss_mb: float | None = None  # in-process: the child's peak; grpc: server RSS after the runs
    rss_peak_mb: float | None = None  # peak: VmHWM of the child (in-process) or the server
    rss_child_mb: dict[str, float] | None = None  # in-process child: peak, ru_maxrss, rss
    info_p50_ms: float | None = None  # grpc: p50 of the model-free Info RPC (the RPC floor)
    load_s: float = 0.0  # encoder load (in-process) or start to SERVING (grpc)
    max_abs_diff_vs_inproc: float | None = None
    errors: list[str] = field(default_factory=list)
    rounds: int = 1  # how many rounds the figures are the median of


def median_result(rounds: list[PathResult]) -> PathResult:
    """One result per path: the median of each figure over the rounds that measured it."""
    first = rounds[0]
    merged = PathResult(first.backend, first.threads, first.path)
    for name, value in asdict(first).items():
        if isinstance(value, float) or (value is None and name != "rss_child_mb"):
            seen = [getattr(r, name) for r in rounds if isinstance(getattr(r, name), float)]
            setattr(merged, name, float(np.median(seen)) if seen else None)
    merged.rss_child_mb = first.rss_child_mb
    merged.errors = [e for r in rounds for e in r.errors]
    merged.rounds = len(rounds)
    return merged


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def run_b1(
    call: Callable[[list[str]], np.ndarray], texts: list[str]
) -> tuple[list[float], list[np.ndarray]]:
    latencies: list[float] = []
    vectors: list[np.ndarray] = []
    for text in texts:
        t0 = time.perf_counter()
        v = call([text])
        latencies.append(time.perf_counter() - t0)
        vectors.append(v)
    return latencies, vectors


def run_big(
    call: Callable[[list[str]], np.ndarray], batches: list[list[str]]
) -> tuple[float, list[np.ndarray]]:
    vectors: list[np.ndarray] = []
    t0 = time.perf_counter()
    for batch in batches:
        vectors.append(call(batch))
    return time.perf_counter() - t0, vectors


def fill_b1_big(
    res: PathResult,
    call: Callable[[list[str]], np.ndarray],
    plan: Plan,
    probe: Callable[[], Samples] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    for text in plan.warm[:WARM_CALLS]:
        call([text])
    call(plan.warm)
    before = probe() if probe else {}
    latencies, v1 = run_b1(call, plan.b1)
    if probe:  # where the batch-1 time goes: server handler vs model call
        after = probe()
        server = mean_delta(before, after, "grpc_server_handling_seconds", grpc_method="Embed")
        forward = mean_delta(before, after, "hippo_embedding_forward_seconds")
        res.b1_server_ms = None if server is None else server * 1000
        res.b1_forward_ms = None if forward is None else forward * 1000
    wall = sum(latencies)
    res.b1_tps = len(plan.b1) / wall
    res.b1_p50_ms = pct(latencies, 50) * 1000
    res.b1_p95_ms = pct(latencies, 95) * 1000
    res.b1_mean_ms = wall / len(latencies) * 1000
    elapsed, vbig = run_big(call, plan.big)
    n_big = sum(len(b) for b in plan.big)
    res.big_tps = n_big / elapsed
    res.big_call_ms = elapsed / len(plan.big) * 1000
    return v1, vbig


# --------------------------------------------------------------------------- in-process


def bench_inprocess(backend: str, threads: int, plan: Plan) -> tuple[PathResult, list[np.ndarray]]:
    from hippo_embedding import adapters
    from hippo_embedding.settings import EmbeddingSettings

    res = PathResult(backend, threads, "in-process")
    t0 = time.perf_counter()
    encoder = adapters.load(EmbeddingSettings(backend=backend, threads=threads))
    res.load_s = time.perf_counter() - t0

    def call(texts: list[str]) -> np.ndarray:
        v = np.asarray(encoder.encode(texts))
        if v.shape != (len(texts), DIMENSION):
            raise RuntimeError(f"in-process vectors of shape {v.shape}")
        return v

    v1, vbig = fill_b1_big(res, call, plan)
    return res, v1 + vbig  # the encoder goes with this frame


def inprocess_rss(backend: str, threads: int, texts: list[str], timeout: float) -> dict[str, float]:
    """Memory of a fresh child that loads the encoder and embeds `texts`, in MB:
    `peak` (VmHWM), `ru_maxrss` (as getrusage reports it) and `rss` (VmRSS at the end)."""
    proc = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, backend, str(threads)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"RSS child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "peak": data["vm_hwm_kb"] / 1024,
        "ru_maxrss": data["ru_maxrss_kb"] / 1024,
        "rss": data["vm_rss_kb"] / 1024,
    }


# --------------------------------------------------------------------------- gRPC


def scrape(metrics_port: int) -> Samples:
    return testing.scrape(f"http://{HOST}:{metrics_port}/metrics")


def mean_delta(before: Samples, after: Samples, name: str, **labels: str) -> float | None:
    """Mean of histogram `name` over the observations between two scrapes."""
    count = testing.metric(after, f"{name}_count", **labels) - testing.metric(
        before, f"{name}_count", **labels
    )
    total = testing.metric(after, f"{name}_sum", **labels) - testing.metric(
        before, f"{name}_sum", **labels
    )
    return total / count if count > 0 else None


def vm_hwm_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


@contextlib.contextmanager
def embedding_server(
    backend: str, threads: int, ready_timeout: float, log_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int, int, float]]:
    """Start `python -m hippo_embedding`, yield (process, port, metrics port, ready seconds)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    port, metrics_port = reserve_port(), reserve_port()
    while metrics_port == port:
        metrics_port = reserve_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HIPPO_EMBEDDING_")}
    env.update(
        HIPPO_EMBEDDING_HOST=HOST,
        HIPPO_EMBEDDING_BACKEND=backend,
        HIPPO_EMBEDDING_THREADS=str(threads),
        HIPPO_EMBEDDING_PORT=str(port),
        HIPPO_EMBEDDING_METRICS_PORT=str(metrics_port),
        HIPPO_EMBEDDING_CACHE_ENTRIES="0",
        HIPPO_EMBEDDING_LOG_LEVEL="warning",
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hippo_embedding"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        t0 = time.perf_counter()
        deadline = t0 + ready_timeout
        with grpc.insecure_channel(f"{HOST}:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}: {tail(log_path)}")
                if time.perf_counter() > deadline:
                    raise TimeoutError(
                        f"server not SERVING after {ready_timeout}s: {tail(log_path)}"
                    )
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=1.0)
                    if status.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        yield proc, port, metrics_port, time.perf_counter() - t0
    finally:
        stop_server(proc)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def tail(path: Path, chars: int = 2000) -> str:
    with contextlib.suppress(OSError):
        return path.read_text(errors="replace")[-chars:]
    return ""


def bench_grpc(
    backend: str,
    threads: int,
    plan: Plan,
    concurrency: int,
    call_timeout: float,
    ready_timeout: float,
    reference: list[np.ndarray] | None,
) -> PathResult:
    import grpc
    import psutil

    from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc

    res = PathResult(backend, threads, "grpc")
    with tempfile.TemporaryDirectory(prefix="hippo-bench-") as tmp:
        log_path = Path(tmp) / "server.log"
        with (
            embedding_server(backend, threads, ready_timeout, log_path) as (proc, port, mport, up),
            grpc.insecure_channel(f"{HOST}:{port}") as channel,
        ):
            res.load_s = up
            stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)

            def call(texts: list[str]) -> np.ndarray:
                resp = stub.Embed(embedding_pb2.EmbedRequest(texts=texts), timeout=call_timeout)
                v = np.frombuffer(resp.vectors, dtype="<f4").reshape(resp.count, resp.dimension)
                if v.shape != (len(texts), DIMENSION):
                    raise RuntimeError(f"gRPC vectors of shape {v.shape}")
                return v

            info: list[float] = []
            for _ in range(INFO_CALLS):
                t0 = time.perf_counter()
                stub.Info(embedding_pb2.InfoRequest(), timeout=call_timeout)
                info.append(time.perf_counter() - t0)
            res.info_p50_ms = pct(info, 50) * 1000
            v1, vbig = fill_b1_big(res, call, plan, lambda: scrape(mport))
            if reference is not None:
                got = v1 + vbig
                res.max_abs_diff_vs_inproc = max(
                    float(np.max(np.abs(a - b))) for a, b in zip(got, reference, strict=True)
                )

            def one(text: str) -> float:
                t0 = time.perf_counter()
                call([text])
                return time.perf_counter() - t0

            before = scrape(mport)
            latencies: list[float] = []
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                t0 = time.perf_counter()
                futures = [pool.submit(one, text) for text in plan.concurrent]
                bound = call_timeout * (len(futures) / concurrency + 2)
                done, not_done = wait(futures, timeout=bound)
                elapsed = time.perf_counter() - t0
                for f in not_done:
                    f.cancel()
                for f in done:
                    exc = f.exception()
                    if exc is None:
                        latencies.append(f.result())
                    else:
                        res.errors.append(repr(exc)[:300])
            after = scrape(mport)
            if not_done:
                res.errors.append(f"{len(not_done)} concurrent requests unfinished")
            res.concurrent_tps = len(latencies) / elapsed
            if latencies:
                res.concurrent_p50_ms = pct(latencies, 50) * 1000
                res.concurrent_p95_ms = pct(latencies, 95) * 1000
            res.reqs_per_batch = mean_delta(before, after, "hippo_embedding_batch_requests")
            res.texts_per_batch = mean_delta(before, after, "hippo_embedding_batch_texts")

            res.rss_mb = psutil.Process(proc.pid).memory_info().rss / 2**20
            res.rss_peak_mb = vm_hwm_mb(proc.pid)
    return res


# --------------------------------------------------------------------------- report


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: list[PathResult], batch: int) -> str:
    header = [
        "backend",
        "threads",
        "path",
        "b1 texts/s",
        "b1 p50 ms",
        "b1 p95 ms",
        f"b{batch} texts/s",
        "concurrent texts/s",
        "reqs/batch",
        "RSS MB",
    ]
    rows = [
        [
            r.backend,
            str(r.threads),
            r.path,
            fmt(r.b1_tps),
            fmt(r.b1_p50_ms, 2),
            fmt(r.b1_p95_ms, 2),
            fmt(r.big_tps),
            fmt(r.concurrent_tps),
            fmt(r.reqs_per_batch, 2),
            fmt(r.rss_mb, 0),
        ]
        if r.big_tps
        else [r.backend, str(r.threads), r.path, *(["failed"] + ["-"] * 6)]
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    left = {0, 2}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
    return "\n".join(out)


def ratios(results: list[PathResult], batch: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    keys = list(dict.fromkeys((r.backend, r.threads) for r in results))
    for backend, threads in keys:
        pair = {r.path: r for r in results if (r.backend, r.threads) == (backend, threads)}
        local, remote = pair.get("in-process"), pair.get("grpc")
        if local is None or remote is None or not local.big_tps or not remote.big_tps:
            continue  # a path failed: its errors are printed instead
        ratio = remote.big_tps / local.big_tps
        diff = remote.b1_p50_ms - local.b1_p50_ms
        out.append(
            {
                "backend": backend,
                "threads": threads,
                f"b{batch}_throughput_ratio": ratio,
                "b1_p50_diff_ms": diff,
                "b1_throughput_ratio": remote.b1_tps / local.b1_tps if local.b1_tps else None,
                "concurrent_vs_inprocess_b1": (
                    remote.concurrent_tps / local.b1_tps
                    if remote.concurrent_tps and local.b1_tps
                    else None
                ),
                "ratio_pass": ratio >= TARGET_RATIO,
                "p50_pass": diff <= TARGET_P50_MS,
            }
        )
    return out


def ratio_text(rows: list[dict[str, Any]], batch: int) -> str:
    lines = ["gRPC vs in-process (same backend, same threads):"]
    for r in rows:
        ratio = r[f"b{batch}_throughput_ratio"]
        lines.append(
            f"  {r['backend']:<6} threads={r['threads']}:  "
            f"b{batch} throughput {ratio:.3f}x (target >= {TARGET_RATIO:.2f}) "
            f"{'PASS' if r['ratio_pass'] else 'MISS'}   "
            f"b1 p50 {r['b1_p50_diff_ms']:+.2f} ms (target <= {TARGET_P50_MS:.1f}) "
            f"{'PASS' if r['p50_pass'] else 'MISS'}   "
            f"[b1 throughput {fmt(r['b1_throughput_ratio'], 3)}x; "
            f"concurrent/in-process b1 {fmt(r['concurrent_vs_inprocess_b1'], 2)}x]"
        )
    return "\n".join(lines)


def chart(results: list[PathResult], batch: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(f"{r.backend} t{r.threads}" for r in results))
    paths = ["in-process", "grpc"]
    metrics: list[tuple[str, Callable[[PathResult], float | None]]] = [
        ("batch 1", lambda r: r.b1_tps),
        (f"batch {batch}", lambda r: r.big_tps),
        ("concurrent single-text", lambda r: r.concurrent_tps),
    ]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 4.2))
    x = np.arange(len(groups))
    width = 0.38
    for ax, (title, get) in zip(axes, metrics, strict=True):
        for j, p in enumerate(paths):
            values: list[float | None] = []
            for g in groups:
                match = [r for r in results if f"{r.backend} t{r.threads}" == g and r.path == p]
                values.append(get(match[0]) if match else None)
            heights = [v or 0.0 for v in values]
            labels = ["" if not v else f"{v:.0f}" for v in values]  # not measured: no bar
            bars = ax.bar(x + (j - 0.5) * width, heights, width, label=p, color=f"C{j}")
            ax.bar_label(bars, labels=labels, fontsize=7)
        ax.set_title(title)
        ax.set_xticks(x, groups)
        ax.set_ylabel("texts/s")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle("hippo embedding: texts/s, gRPC vs in-process")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def parse_list(text: str, kind: Callable[[str], Any]) -> list[Any]:
    return [kind(part.strip()) for part in text.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Benchmark the embedding service: gRPC vs in-process texts/s, "
        "single-query latency and RSS, per backend and thread count.",
    )
    p.add_argument(
        "--backends",
        default="onnx,torch",
        help="comma-separated: onnx, torch (default: %(default)s)",
    )
    p.add_argument(
        "--threads",
        default="1",
        help="comma-separated model thread counts, e.g. 1,2 (default: %(default)s)",
    )
    p.add_argument(
        "--b1-calls",
        type=int,
        default=None,
        help="N: single-text calls per path (default 200; 40 with --quick)",
    )
    p.add_argument(
        "--big-calls",
        type=int,
        default=None,
        help="M: calls of --batch-size texts per path (default 8; 3 with --quick)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="texts per call of the big load (default: %(default)s)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="C: concurrent gRPC clients (threads) in the concurrent run (default: %(default)s)",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="single-text requests in the concurrent run (default 256; 64 with --quick)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternate in-process and gRPC this many times per config; figures are the "
        "medians over rounds (default 3)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: N=40, M=3, 64 concurrent requests (explicit flags win)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="LoCoMo JSON whose turn texts are the corpus; synthetic sentences if absent "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--call-timeout",
        type=float,
        default=60.0,
        help="deadline of each RPC in s (default: %(default)s)",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        help="how long to wait for the server to be SERVING, in s (default: %(default)s)",
    )
    p.add_argument(
        "--no-rss-child",
        action="store_true",
        help="skip the fresh child process that measures in-process RSS",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=OUT_DIR / "embedding.json",
        help="where to write every figure as JSON (default: %(default)s)",
    )
    p.add_argument(
        "--png",
        type=Path,
        default=OUT_DIR / "embedding.png",
        help="where to write the PNG bar chart (default: %(default)s)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    n = args.b1_calls if args.b1_calls is not None else (40 if args.quick else 200)
    m = args.big_calls if args.big_calls is not None else (3 if args.quick else 8)
    requests = args.requests if args.requests is not None else (64 if args.quick else 256)
    backends = parse_list(args.backends, str)
    threads_list = parse_list(args.threads, int)
    bad = [b for b in backends if b not in ("onnx", "torch")]
    if bad or not backends or not threads_list or min(threads_list) < 1:
        raise SystemExit(f"bad --backends/--threads: {args.backends!r} {args.threads!r}")
    if min(n, m, requests, args.concurrency, args.batch_size, args.rounds) < 1:
        raise SystemExit("counts must be >= 1")

    batch = args.batch_size
    need = n + m * batch + requests + max(batch, WARM_CALLS)
    texts, source = load_texts(args.data, need)
    plan = make_plan(texts, n, m, batch, requests)
    print(
        f"corpus: {source} ({len(texts)} distinct texts used, mean "
        f"{np.mean([len(t) for t in texts]):.0f} chars); N={n} M={m}x{batch} "
        f"C={args.concurrency} requests={requests}; {platform.platform()}, "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # torch weight-loading bar
    results: list[PathResult] = []
    started = time.perf_counter()
    for backend in backends:
        for threads in threads_list:
            label = f"{backend} threads={threads}"
            local_rounds: list[PathResult] = []
            remote_rounds: list[PathResult] = []
            # In-process and gRPC alternate, round after round, and each figure is the
            # median over rounds: a slow minute of the machine hits both paths alike.
            for round_no in range(1, args.rounds + 1):
                tag = f"{label} round {round_no}/{args.rounds}"
                print(f"[{time.perf_counter() - started:6.1f}s] {tag}: in-process", flush=True)
                local, reference = bench_inprocess(backend, threads, plan)
                if round_no == 1 and not args.no_rss_child:
                    try:
                        child = inprocess_rss(backend, threads, plan.warm, timeout=300)
                        local.rss_mb = local.rss_peak_mb = child["peak"]
                        local.rss_child_mb = child
                    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                        local.errors.append(f"rss child: {exc}"[:500])
                local_rounds.append(local)
                print(f"[{time.perf_counter() - started:6.1f}s] {tag}: gRPC", flush=True)
                try:
                    remote = bench_grpc(
                        backend,
                        threads,
                        plan,
                        args.concurrency,
                        args.call_timeout,
                        args.ready_timeout,
                        reference,
                    )
                except Exception as exc:  # report the failure, go on with the next config
                    remote = PathResult(backend, threads, "grpc", errors=[repr(exc)[:2000]])
                    print(f"  gRPC run failed: {exc!r}", file=sys.stderr)
                remote_rounds.append(remote)
                del reference
                gc.collect()
            results.append(median_result(local_rounds))
            results.append(median_result(remote_rounds))

    print()
    print(table(results, batch))
    print(
        "RSS: in-process = peak RSS (VmHWM) of a fresh child that loads the encoder and embeds one "
        "batch; grpc = server RSS after the runs (server peak: "
        + ", ".join(
            f"{r.backend} t{r.threads} {fmt(r.rss_peak_mb, 0)} MB"
            for r in results
            if r.path == "grpc"
        )
        + ")"
    )
    rows = ratios(results, batch)
    print()
    print(ratio_text(rows, batch))
    inproc_mean = {(r.backend, r.threads): r.b1_mean_ms for r in results if r.path != "grpc"}
    for r in results:
        if r.info_p50_ms is not None:
            print(
                f"  {r.backend} t{r.threads} grpc b1: client mean {r.b1_mean_ms:.2f} ms = "
                f"server handler {fmt(r.b1_server_ms, 2)} ms (of which model call "
                f"{fmt(r.b1_forward_ms, 2)} ms) + client/wire; in-process mean "
                f"{fmt(inproc_mean.get((r.backend, r.threads)), 2)} ms; "
                f"Info RPC (no model) p50 {r.info_p50_ms:.2f} ms"
            )
        if r.max_abs_diff_vs_inproc is not None:
            print(
                f"  {r.backend} t{r.threads}: max |gRPC - in-process| over the b1 and "
                f"b{batch} vectors = {r.max_abs_diff_vs_inproc:.2e}"
            )
        for e in r.errors:
            print(f"  ERROR {r.backend} t{r.threads} {r.path}: {e}")

    versions: dict[str, str] = {}
    for mod in ("grpc", "onnxruntime", "torch", "sentence_transformers", "numpy"):
        with contextlib.suppress(Exception):
            versions[mod] = str(__import__(mod).__version__)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
        },
        "versions": versions,
        "params": {
            "backends": backends,
            "threads": threads_list,
            "b1_calls": n,
            "big_calls": m,
            "batch_size": batch,
            "rounds": args.rounds,
            "concurrency": args.concurrency,
            "concurrent_requests": requests,
            "corpus": source,
            "server_cache_entries": 0,
            "quick": args.quick,
        },
        "targets": {
            f"b{batch}_throughput_ratio_min": TARGET_RATIO,
            "b1_p50_diff_ms_max": TARGET_P50_MS,
        },
        "results": [asdict(r) for r in results],
        "ratios": rows,
        "elapsed_s": time.perf_counter() - started,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    chart(results, batch, args.png)
    print(f"\nwrote {args.json} and {args.png} ({report['elapsed_s']:.0f} s)")
    return 0 if all(not r.errors for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
