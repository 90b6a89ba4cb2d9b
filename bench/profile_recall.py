"""Where a Recall's CPU goes: py-spy samples every service while closed-loop clients ask.

One cluster from `make run`'s launcher (cache off), one user with `--turns` turns (as
bench/load.py fills it), `--clients` clients asking LoCoMo questions for `--seconds`,
while `py-spy record` samples each service process (idle frames left out). Prints, per
service, CPU ms per Recall (from /proc) and the functions with the largest share of its
samples, by own time and by inclusive time; writes the raw collapsed stacks to
bench/out/profile/<service>.txt for flame graphs.

Needs py-spy (`.venv/bin/pip install py-spy`; not a dependency of Hippo).

    .venv/bin/python bench/profile_recall.py [--turns 10000] [--clients 16] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from load import OUT, cpu_seconds, load_user, recall_level, service_pids, started
from recall_latency import corpus

BIN = Path(sys.executable).parent


def frame_name(frame: str) -> str:
    """`fn (path/to/module.py:12)` -> `fn (module.py)`: lines merged, paths shortened."""
    name, _, where = frame.partition(" (")
    module = where.split(":", 1)[0].rsplit("/", 1)[-1]
    return f"{name} ({module})" if module else name


def summarise(path: Path, top: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Samples, and the `top` frames by own and by inclusive samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for raw in path.read_text().splitlines():
        stack, _, count = raw.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";") if not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    return total, own.most_common(top), inclusive.most_common(top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=25, help="frames listed per service")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    spy = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if spy is None:
        parser.error("py-spy not found: .venv/bin/pip install py-spy")
    env = {"HIPPO_EMBEDDING_CACHE_ENTRIES": "0"}
    env.update(item.split("=", 1) for item in args.env)
    out = OUT / "profile"
    out.mkdir(parents=True, exist_ok=True)
    texts, questions = corpus()
    with started(env) as cluster:
        pids = service_pids(cluster)
        load_user(cluster, args.turns, texts, "profile")
        asyncio.run(recall_level(cluster.gateway, args.clients, 3.0, questions))  # warm
        spies = {
            name: subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--duration",
                    str(int(args.seconds) + 2),
                    "--nonblocking",
                    "--output",
                    str(out / f"{name}.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for name, pid in pids.items()
            if name != "injection"  # not on Recall's path
        }
        before = cpu_seconds(pids)
        row = asyncio.run(recall_level(cluster.gateway, args.clients, args.seconds, questions))
        after = cpu_seconds(pids)
        for proc in spies.values():
            proc.wait(timeout=60)
    print(
        f"\n{args.clients} clients: {row['rps']:.0f} req/s, p50 {row['p50']:.1f} ms, "
        f"p99 {row['p99']:.1f} ms\n"
    )
    for name in spies:
        cpu = 1000 * (after[name] - before[name]) / max(1, row["ok"])
        total, own, inclusive = summarise(out / f"{name}.txt", args.top)
        print(f"## {name}: {cpu:.2f} ms CPU per Recall, {total} samples\n")
        print("| own % | frame | | inclusive % | frame |")
        print("|---|---|---|---|---|")
        for (fo, no), (fi, ni) in zip(own, inclusive, strict=False):
            print(f"| {100 * no / total:.1f} | {fo} | | {100 * ni / total:.1f} | {fi} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
