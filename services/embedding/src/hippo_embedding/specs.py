"""Which embedders to load: `HIPPO_EMBEDDING_MODELS` parsed and checked, nothing loaded.

A spec is `builtin` (all-MiniLM-L6-v2 on the configured backend) or a directory,
optionally `NAME=PATH` (default name: the directory's base name). A directory is either
a sentence-transformers one (`modules.json` or `config_sentence_transformers.json`,
run on torch) or an ONNX one (`model.onnx` + `tokenizer.json`, run on onnxruntime); one
that is both follows `backend`. Only the file system is read here, so a bad setting
stops the process at start with a message, before any model is loaded.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BUILTIN = "builtin"
BUILTIN_NAME = "sentence-transformers/all-MiniLM-L6-v2"
ST_MARKERS = ("modules.json", "config_sentence_transformers.json")
ONNX_FILES = ("model.onnx", "tokenizer.json")
POOLINGS = ("mean", "cls")

Layout = Literal["builtin", "sentence-transformers", "onnx"]


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the id in EmbedRequest.model / EmbedResponse.model
    layout: Layout
    path: Path | None = None  # None for builtin


def _layout(path: Path, backend: str) -> Layout:
    is_st = any((path / marker).is_file() for marker in ST_MARKERS)
    is_onnx = all((path / f).is_file() for f in ONNX_FILES)
    if is_onnx and (backend == "onnx" or not is_st):
        hippo = path / "hippo.json"
        if hippo.is_file():
            pooling = json.loads(hippo.read_text()).get("pooling", "mean")
            if pooling not in POOLINGS:
                raise ValueError(f"{hippo}: pooling must be one of {POOLINGS}, got {pooling!r}")
        return "onnx"
    if is_st:
        if importlib.util.find_spec("sentence_transformers") is None:
            raise ValueError(
                f"{path} is a sentence-transformers directory, but sentence-transformers "
                "is not installed (pip install 'hippo-embedding[torch]')"
            )
        return "sentence-transformers"
    raise ValueError(
        f"{path}: unknown layout; expected a sentence-transformers directory "
        f"({' or '.join(ST_MARKERS)}) or an ONNX one ({' + '.join(ONNX_FILES)})"
    )


def parse(text: str, backend: str) -> list[ModelSpec]:
    """The specs of a MODELS value, the default first; ValueError says what is wrong."""
    specs: list[ModelSpec] = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            raise ValueError(f"empty model spec in {text!r} (a stray comma?)")
        if item == BUILTIN:
            specs.append(ModelSpec(BUILTIN_NAME, "builtin"))
            continue
        name, sep, where = item.partition("=")
        if not sep:
            name, where = "", item
        name, where = name.strip(), where.strip()
        if sep and not (name and where):
            raise ValueError(f"model spec {item!r}: NAME=PATH needs both a name and a path")
        path = Path(where).expanduser().resolve()
        if not path.is_dir():
            raise ValueError(f"model spec {item!r}: {path} is not a directory")
        specs.append(ModelSpec(name or path.name, _layout(path, backend), path))
    names = [spec.name for spec in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"duplicate model names {duplicates}: give each directory its own NAME=PATH"
        )
    return specs
