"""How close the onnx int8 backend's vectors are to the fp32 torch reference.

The service's default backend must stay within cosine 0.999 of the fp32 model. This
embeds the same texts with both backends in-process and reports the cosine between the
two vectors of each text: mean, percentiles, minimum, and the share below 0.999.

Run: .venv/bin/python bench/embedding_parity.py [--data FILE] [--limit N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo-dev.json"


def turns(path: Path) -> list[str]:
    texts: list[str] = []
    for sample in json.loads(path.read_text()):
        for key, session in sample["conversation"].items():
            if re.fullmatch(r"session_\d+", key):
                texts.extend(turn["text"] for turn in session if turn.get("text"))
    return list(dict.fromkeys(texts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo-format JSON")
    parser.add_argument("--limit", type=int, default=0, help="texts to use (0: all)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "out" / "parity.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from hippo_embedding.adapters.onnx_encoder import OnnxEncoder
    from hippo_embedding.adapters.torch_encoder import TorchEncoder

    texts = turns(args.data)
    if args.limit:
        texts = texts[: args.limit]
    # The packaged graph: the parity docs/embedding.md tabulates (the dynamic default is
    # compared with fp32 by a test and in the same page).
    onnx, torch = OnnxEncoder(threads=2, quantization="weights"), TorchEncoder(threads=2)
    batches = range(0, len(texts), 64)
    a = np.concatenate([onnx.encode(texts[i : i + 64]) for i in batches])
    b = np.concatenate([torch.encode(texts[i : i + 64]) for i in batches])
    cos = (a * b).sum(axis=1)
    worst = int(np.argmin(cos))
    report: dict[str, Any] = {
        "texts": len(texts),
        "mean": float(cos.mean()),
        "p1": float(np.percentile(cos, 1)),
        "p5": float(np.percentile(cos, 5)),
        "median": float(np.median(cos)),
        "min": float(cos.min()),
        "share_below_0.999": float((cos < 0.999).mean()),
        "worst_text": texts[worst][:200],
    }
    print(f"onnx int8 vs torch fp32, cosine per text over {len(texts)} texts from {args.data}")
    print(f"{'mean':>8} {'median':>8} {'p5':>8} {'p1':>8} {'min':>8} {'<0.999':>8}")
    print(
        f"{report['mean']:8.5f} {report['median']:8.5f} {report['p5']:8.5f} "
        f"{report['p1']:8.5f} {report['min']:8.5f} {report['share_below_0.999']:8.1%}"
    )
    print(f"worst ({report['min']:.4f}): {report['worst_text']!r}")
    print("target: mean >= 0.999 ->", "PASS" if report["mean"] >= 0.999 else "MISS")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
